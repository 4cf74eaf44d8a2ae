"""code_execution_reward: code extraction, partial credit, hostile completions in a batch."""

import json
import time

import pytest

from grpokit.rewards import code_execution_reward, extract_code, make_code_execution_reward

pytestmark = pytest.mark.usefixtures("no_stray_processes")

TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]


def fenced(body: str, lang: str = "python") -> str:
    return f"Here is my solution:\n```{lang}\n{body}\n```\nDone."


def test_extract_code_takes_the_last_python_block():
    text = "```python\nx = 1\n```\ntext\n```py\nx = 2\n```\n```bash\nrm -rf /\n```"
    assert extract_code(text) == "x = 2\n"
    assert extract_code("x = 3") == "x = 3"  # no block: the whole completion
    assert extract_code("```python\nx = 1\n```\n```python\nx = 4") == "x = 4"  # truncated last block
    assert extract_code("```Python3\ny = 1\n```") == "y = 1\n"


def test_extract_code_is_linear_on_many_unclosed_fences():
    text = "```python\n" * 100_000
    start = time.monotonic()
    extract_code(text)
    assert time.monotonic() - start < 10  # linear: milliseconds; quadratic: minutes


@pytest.fixture(scope="module")
def reward():
    return make_code_execution_reward(timeout=3.0, test_timeout=1.0, max_workers=2)


def test_right_partial_wrong_malformed_and_inapplicable(reward):
    completions = [
        fenced("def add(a, b):\n    return a + b"),  # right: 3/3
        fenced("def add(a, b):\n    return a + b if a > 0 else 99"),  # 2/3 (add(-1, 1) is wrong)
        fenced("def add(a, b):\n    return a - b"),  # add(-1,1) = -2, add(1,2) = -1, add(2,2) = 0: 0/3
        fenced("def add(a, b) return a + b"),  # syntax error: 0/3
        "def add(a, b):\n    return a + b",  # no fence: whole completion runs: 3/3
        fenced("def add(a, b):\n    return a + b"),  # no tests: None
    ]
    tests = [TESTS] * 5 + [[]]
    got = reward(["p"] * 6, completions, [[1]] * 6, tests=tests)
    assert got == pytest.approx([1.0, 2 / 3, 0.0, 0.0, 1.0, None])


def test_conversational_and_json_tests_column(reward):
    completion = [{"role": "assistant", "content": fenced("def add(a, b):\n    return a + b")}]
    got = reward(["p"], [completion], [[1]], tests=[json.dumps(TESTS[:2])])
    assert got == [1.0]


def test_hostile_batch_scores_low_and_returns(reward):
    bodies = [
        "while True:\n    pass",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except Exception:\n        pass",
        "x = bytearray(50 * 1024**3)",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
        "def add(a, b):\n    return a + b",  # an honest one in the same batch
    ]
    start = time.monotonic()
    got = reward(["p"] * 5, [fenced(body) for body in bodies], [[1]] * 5, tests=[TESTS] * 5)
    assert time.monotonic() - start < 60  # two 3 s timeouts per worker at most, plus start-up
    assert got == [0.0, 0.0, 0.0, 0.0, 1.0]


def test_missing_tests_column_is_an_error():
    with pytest.raises(KeyError, match="tests"):
        code_execution_reward(["p"], ["x = 1"], [[1]], solution=["1"])
