"""The calculator: safe evaluation, its environment, and the calculator task (splits, episodes, reward)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from grpokit.envs.calculator import CalculatorEnvironment, calculator
from grpokit.envs.tools import format_tool_call, tool_schema
from grpokit.tasks.arithmetic import is_held_out
from grpokit.tasks.calculator import (
    TOOL_TAGS,
    calculator_exact_answer_reward,
    extract_answer,
    make_calculator_splits,
    uses_tool,
    worked_episode,
    worked_solution,
)

# --- the evaluator ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("347*86", "29842"),
        ("12*34", "408"),
        (" 1 + 2 * 3 ", "7"),
        ("(1+2)*3", "9"),
        ("-5+2", "-3"),
        ("--4", "4"),
        ("7/2", "3.5"),
        ("6/3", "2"),
        ("7//2", "3"),
        ("-7//2", "-4"),
        ("7%3", "1"),
        ("2**10", "1024"),
        ("2**-2", "0.25"),
        ("1.5*2", "3"),
        ("0.1+0.2", "0.30000000000000004"),
        ("10**99", "1" + "0" * 99),
    ],
)
def test_calculator_by_hand(expression, expected):
    assert calculator(expression) == expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("x+1", "names \\('x'\\) not allowed"),
        ("abs(-3)", "function calls not allowed"),
        ("__import__('os').system('echo hi')", "function calls not allowed"),
        ("(1).real", "attribute access not allowed"),
        ("'a'*3", "only numbers are allowed"),
        ("True+1", "only numbers are allowed"),
        ("1j*2", "only numbers are allowed"),
        ("1<2", "comparisons not allowed"),
        ("[1, 2]", "not allowed"),
        ("9**9**9", "exponent too large"),
        ("2**400", "number too large"),
        ("10**100", "number too large"),
        ("10**60*10**60", "number too large"),
        ("1e308*10", "number too large"),
        ("(-8)**0.5", "not a real number"),
        ("1/0", "division by zero"),
        ("5%0", "division by zero"),
        ("0**-1", "division by zero"),
        ("1+", "not an arithmetic expression"),
        ("", "empty expression"),
        ("1+" * 150 + "1", "too long"),
    ],
)
def test_calculator_refuses_with_a_clear_error(expression, message):
    with pytest.raises(ValueError, match=message):
        calculator(expression)


def test_calculator_schema_is_the_documented_one():
    function = tool_schema(calculator)["function"]
    assert function["name"] == "calculator"
    assert function["parameters"]["required"] == ["expression"]
    assert function["parameters"]["properties"]["expression"]["type"] == "string"


# --- the environment -------------------------------------------------------------------------------------


def test_environment_tool_turn_then_graded_answer():
    env = CalculatorEnvironment()
    env.reset({"prompt": "347*86=", "solution": "29842"})
    turn = env.step(format_tool_call("calculator", {"expression": "347*86"}))
    assert turn.observation == "<tool_response>29842</tool_response>" and not turn.done
    assert turn.info == {"tool_calls": 1, "tool_errors": 0, "malformed_tool_calls": 0}
    bad = env.step(format_tool_call("calculator", {"expression": "347/0"}))
    assert bad.observation == "<tool_response>error: ValueError: division by zero</tool_response>"
    assert bad.info["tool_errors"] == 1
    for action, reward in [
        ("<answer>29842</answer>", 1.0),
        ("<answer> 029842 </answer>", 1.0),
        ("<answer>1</answer><answer>29842</answer>", 1.0),
        ("<answer>29843</answer>", 0.0),
        ("29842", 0.0),
        ("<answer>29842.0</answer>", 0.0),
    ]:
        end = env.step(action)
        assert end.done and end.reward == reward, action


def test_environment_needs_an_integer_solution():
    env = CalculatorEnvironment()
    with pytest.raises(ValueError, match="'solution'"):
        env.reset({"prompt": "1*2="})
    with pytest.raises(ValueError, match="must be an integer"):
        env.reset({"prompt": "1*2=", "solution": "two"})
    with pytest.raises(RuntimeError, match="before reset"):
        CalculatorEnvironment().final_reward("<answer>2</answer>")


# --- the task --------------------------------------------------------------------------------------------


def test_splits_seeded_distinct_disjoint_and_exact():
    train, test = make_calculator_splits(seed=0, num_train=1000, num_test=100)
    assert (train, test) == make_calculator_splits(seed=0, num_train=1000, num_test=100)
    other_train, other_test = make_calculator_splits(seed=1, num_train=1000, num_test=100)
    assert other_train != train and other_test != test
    train_prompts, test_prompts = {r["prompt"] for r in train}, {r["prompt"] for r in test}
    assert len(train_prompts) == 1000 and len(test_prompts) == 100
    assert not (train_prompts | {r["prompt"] for r in other_train}) & (
        test_prompts | {r["prompt"] for r in other_test}
    )
    assert all(is_held_out(p) for p in test_prompts) and not any(is_held_out(p) for p in train_prompts)
    assert make_calculator_splits(seed=0, num_train=50, num_test=10) == (train[:50], test[:10])
    for row in train + test:
        a, b = row["terms"]
        assert 100 <= a <= 999 and 10 <= b <= 99
        assert row["expression"] == f"{a}*{b}" and row["prompt"] == f"{a}*{b}="
        assert row["solution"] == str(a * b)
    share = sum(r["worked_tool_call"] for r in train) / len(train)
    assert 0.25 < share < 0.35
    assert all(r["worked_tool_call"] == uses_tool(r["prompt"], 0.3) for r in train)


def test_split_arguments_are_checked():
    with pytest.raises(ValueError, match="num_digits"):
        make_calculator_splits(num_digits=0)
    with pytest.raises(ValueError, match="tool_fraction"):
        make_calculator_splits(tool_fraction=1.5)
    with pytest.raises(ValueError, match="only 900 exist"):
        make_calculator_splits(num_digits=1, num_train=1000)
    rows, _ = make_calculator_splits(num_train=20, num_test=2, num_digits=5, tool_fraction=1.0)
    assert all(10_000 <= r["terms"][0] <= 99_999 and r["worked_tool_call"] for r in rows)


def test_worked_episodes_replay_through_the_environment():
    train, _ = make_calculator_splits(seed=0, num_train=60, num_test=5)
    kinds = set()
    for row in train:
        segments = worked_episode(row)
        kinds.add(len(segments))
        env = CalculatorEnvironment()
        env.reset(row)
        turn = None
        for index, (text, is_policy) in enumerate(segments):
            if is_policy:
                turn = env.step(text)
            else:  # an observation: exactly what the environment answered to the previous action
                assert segments[index - 1][1] and text == turn.observation
        assert turn.done and turn.reward == 1.0
        assert segments[-1] == (worked_solution(row), True)
    assert kinds == {1, 3}


def test_worked_episode_by_hand():
    row = {"prompt": "347*86=", "solution": "29842", "terms": [347, 86], "expression": "347*86"}
    assert worked_episode(row) == [("<answer>29842</answer>", True)]
    assert worked_episode({**row, "worked_tool_call": True}) == [
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "347*86"}}</tool_call>', True),
        ("<tool_response>29842</tool_response>", False),
        ("<answer>29842</answer>", True),
    ]
    with pytest.raises(ValueError, match="'expression'"):
        worked_episode({"prompt": "347*86=", "solution": "29842", "worked_tool_call": True})
    with pytest.raises(ValueError, match="integer 'solution'"):
        worked_solution({"prompt": "347*86="})


def test_answer_reward_by_hand():
    call = format_tool_call("calculator", {"expression": "347*86"})
    transcripts = [
        f"{call}<tool_response>29842</tool_response><answer>29842</answer>",
        "<answer>29842</answer>",
        f"{call}<tool_response>29842</tool_response><answer>29843</answer>",
        f"{call}<tool_response>29842</tool_response>",
        [{"role": "assistant", "content": "<answer>29842</answer>"}],
    ]
    rewards = calculator_exact_answer_reward(["347*86="] * 5, transcripts, None, solution=["29842"] * 5)
    assert rewards == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert calculator_exact_answer_reward.__name__ == "calculator_exact_answer_reward"
    assert extract_answer("<answer>007</answer>") == "7"


def test_tool_tags_are_the_formats_tags():
    assert TOOL_TAGS == ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")


def test_the_environment_imports_first_without_a_cycle():
    """grpokit.tasks imports the task, which imports the environment: the environment must not import
    grpokit.tasks at module level."""
    code = (
        "import grpokit.envs.calculator as e, grpokit.tasks.calculator as t;"
        "env = e.CalculatorEnvironment();"
        "env.reset(t.make_calculator_splits(num_train=1, num_test=1)[0][0]); assert env.step('x').done"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=600)
