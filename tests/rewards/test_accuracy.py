"""Math accuracy with math-verify: right, wrong, malformed, ungradable and adversarial answers."""

import time

import pytest

from grpokit.rewards import accuracy_reward, make_accuracy_reward
from grpokit.rewards.isolation.verifier import MathVerifier


@pytest.fixture(scope="module")
def accuracy(verifier):
    return make_accuracy_reward(verifier=verifier)


def run(reward, completions, solutions):
    n = len(completions)
    return reward(["q"] * n, completions, [[1]] * n, solution=solutions)


def test_right_answers_in_every_format(accuracy):
    completions = [
        r"so the answer is \boxed{\frac{1}{2}}",
        "<think>hmm</think><answer>0.5</answer>",
        "work...\n#### 1,000",
        "I count 7 apples.",
        r"<answer>The result is $\sqrt{2}$</answer>",
        r"\boxed{x = 5}",
    ]
    solutions = ["1/2", r"\frac12", "1000", "7", r"\sqrt{2}", "5"]
    assert run(accuracy, completions, solutions) == [1.0] * 6


def test_wrong_and_malformed_answers_score_zero(accuracy):
    completions = [
        r"\boxed{3}",  # wrong
        "<answer>0.51</answer>",  # close is not equal
        "no answer at all",  # nothing to extract
        r"\boxed{}",  # empty box, no number anywhere
        r"<answer>\frac{1}{</answer>",  # broken LaTeX
        "",
    ]
    assert run(accuracy, completions, ["4", "1/2", "4", "4", "1/2", "4"]) == [0.0] * 6


def test_bare_latex_is_read_whole_not_as_its_first_number(accuracy):
    # parsed bare, "3\sqrt{2}" would read as 3 and "2^{10}" as 2
    completions = [
        r"\boxed{3\sqrt{2}}",
        r"\boxed{2^{10}}",
        r"\boxed{2\pi}",
        "<answer>The answer is 5</answer>",
    ]
    assert run(accuracy, completions, ["3", "1024", r"2\pi", "5"]) == [0.0, 1.0, 1.0, 1.0]


def test_ungradable_gold_gives_none_not_zero(accuracy):
    completions = [r"\boxed{4}", r"\boxed{4}", "no answer", r"\boxed{4}"]
    assert run(accuracy, completions, ["", None, r"\boxed{}", "   "]) == [None] * 4


def test_long_solution_text_is_parsed(accuracy):
    solution = r"We add the numbers, and so the final result is $\boxed{12}$."
    assert run(accuracy, [r"\boxed{12}", r"\boxed{13}"], [solution, solution]) == [1.0, 0.0]


def test_conversational_completions(accuracy):
    completions = [
        [{"role": "assistant", "content": r"\boxed{9}"}],
        [{"role": "assistant", "content": r"\boxed{8}"}],
    ]
    assert run(accuracy, completions, ["9", "9"]) == [1.0, 0.0]


@pytest.mark.parametrize(
    ("extract", "text", "expected"),
    [
        ("boxed", r"\boxed{2} then 3", 1.0),
        ("boxed", "just 2", 0.0),  # no box: nothing extracted under a strict strategy
        ("answer_tag", r"<answer>2</answer> \boxed{3}", 1.0),
        ("hash", "#### 2", 1.0),
        ("last_number", r"\boxed{3} ... 2", 1.0),
        ("math_verify", r"the answer is $2$", 1.0),
    ],
)
def test_extraction_strategies(verifier, extract, text, expected):
    reward = make_accuracy_reward(extract, verifier=verifier)
    assert run(reward, [text], ["2"]) == [expected]


def test_missing_solution_column_is_an_error(accuracy):
    with pytest.raises(KeyError, match="solution"):
        accuracy(["q"], ["4"], [[1]], answer=["4"])


def test_default_instance_and_custom_column(verifier):
    assert accuracy_reward.__name__ == "accuracy_reward"
    reward = make_accuracy_reward(solution_column="answer", name="gsm8k_accuracy", verifier=verifier)
    assert reward.__name__ == "gsm8k_accuracy"
    assert reward(["q"], ["#### 72"], [[1]], answer=["72"], trainer_state={"step": 1}) == [1.0]


HOSTILE = [
    r"\boxed{9^{9^{9^{9}}}}",  # a 370-million-digit power: only a kill stops sympy
    "9**9**9**9",
    r"\boxed{(10^{100000000})!}",
    r"\boxed{" + r"\frac{" * 300 + "1" + "}{2}" * 300 + "}",  # deep nesting
    r"\boxed{" + "(" * 5000 + "1" + ")" * 5000 + "}",
    r"\boxed{" + "1+" * 400 + "1}",  # under max_answer_chars, slow to simplify
    "x" * 2_000_000 + r" \boxed{" + "1+" * 200_000 + "1}",  # megabyte string, huge answer
]


@pytest.mark.parametrize("answer", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_answers_return_promptly(answer):
    pool = MathVerifier(max_workers=1)
    try:
        reward = make_accuracy_reward(timeout=1.0, verifier=pool)
        assert pool.gold_parses("3")  # worker start-up is not part of the bound below
        start = time.monotonic()
        assert run(reward, [answer], ["3"]) == [0.0]
        # 1 s hard limit per check; a killed worker restarts lazily (on the next call, not this one)
        assert time.monotonic() - start < 30  # the 1 s limit, not the answer's hours
        assert run(reward, [r"\boxed{3}"], ["3"]) == [1.0]  # the pool still works afterwards
    finally:
        pool.close()


def test_hostile_gold_is_ungradable_not_a_hang():
    pool = MathVerifier(max_workers=1)
    try:
        reward = make_accuracy_reward(timeout=1.0, verifier=pool)
        start = time.monotonic()
        assert run(reward, [r"\boxed{1}"], [r"\boxed{9^{9^{9^{9}}}}"]) in ([None], [0.0])
        assert time.monotonic() - start < 30
    finally:
        pool.close()


def test_batch_runs_on_several_workers(verifier):
    reward = make_accuracy_reward(verifier=verifier)
    completions = [rf"\boxed{{{i}}}" for i in range(16)]
    solutions = [str(i if i % 2 == 0 else i + 1) for i in range(16)]
    assert run(reward, completions, solutions) == [1.0 if i % 2 == 0 else 0.0 for i in range(16)]


def test_hard_timeout_kills_the_stuck_worker():
    # sympy comparing 3 with 9**(9**(9**9)) sits in C code where math-verify's own alarm cannot interrupt it
    pool = MathVerifier(max_workers=1)
    try:  # "\frac{6}{2}" is not a plain integer, so it goes to the worker (plain integers never do)
        assert pool.check("3", r"\frac{6}{2}", timeout=1.0) == 1.0
        stuck = pool._workers[0].proc
        start = time.monotonic()
        assert pool.check("3", r"\boxed{9^{9^{9^{9}}}}", timeout=1.0) == 0.0
        assert time.monotonic() - start < 30
        assert stuck.poll() is not None  # killed and reaped
        assert pool.check("3", r"\frac{6}{2}", timeout=1.0) == 1.0  # a fresh worker took over
        assert pool._workers[0].proc.pid != stuck.pid
    finally:
        pool.close()


@pytest.mark.parametrize(
    ("gold", "answer"),
    [
        ("632", "632"),
        ("632", "0632"),
        ("632", "633"),
        ("-5", "-5"),
        ("-5", "5"),
        ("0", "-0"),
        (" 42 ", "42"),
        ("123456789012345678901234567890", "123456789012345678901234567890"),
        ("123456789012345678901234567890", "123456789012345678901234567891"),
    ],
)
def test_integer_fast_path_agrees_with_math_verify(gold, answer):
    """Plain integers are compared in-process; the verdict is the one math-verify gives."""
    from math_verify import parse, verify

    from grpokit.rewards.isolation.verifier import integer_verdict

    assert integer_verdict(gold, answer) == float(verify(parse(gold), parse(answer)))


def test_integer_fast_path_needs_no_worker():
    from grpokit.rewards.isolation.verifier import MathVerifier, integer_verdict

    verifier = MathVerifier(max_workers=2)
    assert verifier.check_many([("632", "632"), ("632", "0632"), ("7", "8")]) == [1.0, 1.0, 0.0]
    assert verifier.gold_parses("632") and verifier.check("632", "632") == 1.0
    assert all(worker.proc is None for worker in verifier._workers)  # no process was started
    assert integer_verdict("1,234", "1234") is None  # anything but plain integers goes to math-verify
    assert integer_verdict("3/4", "0.75") is None and integer_verdict("9" * 1001, "1") is None
