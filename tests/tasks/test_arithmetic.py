"""The built-in arithmetic task: seeded splits, worked solutions, answer extraction and rewards."""

from __future__ import annotations

import re

import pytest

from grpokit.rewards import make_accuracy_reward, make_format_reward
from grpokit.tasks import Task, get_task
from grpokit.tasks.answers import integer_answer
from grpokit.tasks.arithmetic import (
    ARITHMETIC_FORMAT_PATTERN,
    arithmetic_exact_answer_reward,
    arithmetic_format_reward,
    extract_answer,
    is_held_out,
    make_arithmetic_splits,
    worked_solution,
)


def test_same_seed_same_rows_other_seed_other_rows():
    a = make_arithmetic_splits(seed=3, num_train=200, num_test=50)
    b = make_arithmetic_splits(seed=3, num_train=200, num_test=50)
    c = make_arithmetic_splits(seed=4, num_train=200, num_test=50)
    assert a == b
    assert a[0] != c[0] and a[1] != c[1]


def test_splits_are_disjoint_distinct_and_prefix_stable():
    train, test = make_arithmetic_splits(seed=0, num_train=2000, num_test=300)
    train_prompts = {r["prompt"] for r in train}
    test_prompts = {r["prompt"] for r in test}
    assert len(train_prompts) == 2000 and len(test_prompts) == 300
    assert not train_prompts & test_prompts
    assert all(is_held_out(p) for p in test_prompts) and not any(is_held_out(p) for p in train_prompts)
    # Disjoint across seeds and sizes too: the held-out part of the question space is fixed.
    other_train, _ = make_arithmetic_splits(seed=7, num_train=2000, num_test=10)
    assert not {r["prompt"] for r in other_train} & test_prompts
    small_train, small_test = make_arithmetic_splits(seed=0, num_train=100, num_test=30)
    assert small_train == train[:100] and small_test == test[:30]


def test_rows_hold_exact_answers():
    train, test = make_arithmetic_splits(seed=1, num_train=100, num_test=20, num_terms=3, num_digits=2)
    for row in train + test:
        assert row["prompt"].endswith("=")
        operands = [int(x) for x in row["prompt"][:-1].split("+")]
        assert operands == row["terms"] and len(operands) == 3
        assert all(10 <= x <= 99 for x in operands)
        assert row["solution"] == str(sum(operands))


@pytest.mark.parametrize(
    ("terms", "expected"),
    [
        # units 7+5=12 (write 2, carry 1); tens 4+8+1=13 (write 3, carry 1); hundreds 3+2+1=6 -> 632
        ([347, 285], "7+5=12,4+8+1=13,3+2+1=6<answer>632</answer>"),
        # no carries: 1+8=9, 5+1=6, 1+8=9 -> 969
        ([151, 818], "1+8=9,5+1=6,1+8=9<answer>969</answer>"),
        # final carry kept whole: 9+9+9=27 (carry 2), 9+9+9+2=29 (carry 2), 9+9+9+2=29 -> 2997
        ([999, 999, 999], "9+9+9=27,9+9+9+2=29,9+9+9+2=29<answer>2997</answer>"),
        ([5, 7], "5+7=12<answer>12</answer>"),
    ],
)
def test_worked_solution_golden(terms, expected):
    assert worked_solution({"terms": terms}) == expected


def test_worked_solutions_score_full_marks():
    train, _ = make_arithmetic_splits(seed=0, num_train=300, num_test=1)
    completions = [worked_solution(r) for r in train]
    solutions = [r["solution"] for r in train]
    assert arithmetic_exact_answer_reward(None, completions, None, solution=solutions) == [1.0] * 300
    assert arithmetic_format_reward(None, completions, None, solution=solutions) == [1.0] * 300


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("7+5=12<answer>632</answer>", "632"),
        ("<answer> 0632 </answer>", "632"),
        ("<answer>-5</answer>", "-5"),
        ("<answer>6.3</answer>", None),
        ("<answer></answer>", None),
        ("632", None),
        ("<answer>632", None),
        ("<answer>1</answer><answer>2</answer>", "2"),  # the last tag, as grpokit.rewards reads it
        ("<answer>1</answer><answer>x</answer>", None),
        ("<answer>347+285</answer>", None),  # an expression is not an answer
        ("<answer>" + "9" * 65 + "</answer>", None),  # longer than MAX_ANSWER_DIGITS
        ([{"role": "assistant", "content": "<answer>7</answer>"}], "7"),
    ],
)
def test_extract_answer(completion, answer):
    assert extract_answer(completion) == answer


def test_rewards_on_hand_made_completions():
    good = "7+5=12,4+8+1=13,3+2+1=6<answer>632</answer>"
    cases = [
        # (completion, exact, format)
        (good, 1.0, 1.0),
        (good + "<|endoftext|>", 1.0, 1.0),  # decoded without skip_special_tokens
        ("  " + good + "\n", 1.0, 1.0),
        ("7+5=12,4+8+1=13,3+2+1=7<answer>732</answer>", 0.0, 1.0),  # well formed, wrong
        ("<answer>632</answer>", 1.0, 0.0),  # right answer, no worked steps
        (good + "7+5", 1.0, 0.0),  # trailing junk after the answer
        ("7+5=12,4+8+1=13,3+2+1=6<answer>632", 0.0, 0.0),  # unclosed tag
        ("7+5=12 4+8+1=13<answer>632</answer>", 1.0, 0.0),  # wrong separator
        ("", 0.0, 0.0),
        ([{"role": "assistant", "content": good}], 1.0, 1.0),  # conversational
        ([{"role": "assistant", "content": "<answer>631</answer>"}], 0.0, 0.0),
        ("<answer>347+285</answer>", 0.0, 0.0),  # copying the question is not paid, though it equals 632
        ("<answer>632.0</answer>", 0.0, 0.0),
        (good + "<|endoftext|> <|pad|>\n", 1.0, 1.0),
        ("7" * 1_000_000 + "<answer>632</answer>", 1.0, 0.0),  # megabyte-long text returns promptly
    ]
    completions = [c for c, _, _ in cases]
    solutions = ["632"] * len(cases)
    prompts = ["347+285="] * len(cases)
    exact = arithmetic_exact_answer_reward(prompts, completions, [[]] * len(cases), solution=solutions)
    fmt = arithmetic_format_reward(prompts, completions, [[]] * len(cases), solution=solutions)
    assert exact == [e for _, e, _ in cases]
    assert fmt == [f for _, _, f in cases]


def test_invalid_difficulty_is_refused():
    with pytest.raises(ValueError, match="num_terms"):
        make_arithmetic_splits(num_terms=1)
    with pytest.raises(ValueError, match="num_digits"):
        make_arithmetic_splits(num_digits=0)
    with pytest.raises(ValueError, match="only 100 exist"):
        make_arithmetic_splits(num_train=1000, num_test=10, num_digits=1)


def test_task_rewards_are_the_library_rewards():
    """Item 7 of issue #4: the task grades with grpokit.rewards (math-verify accuracy, regex format)."""
    task = get_task("arithmetic")
    assert task.extract_answer is extract_answer is integer_answer
    exact = task.reward_funcs["exact_answer"]
    assert exact.__name__ == "arithmetic_exact_answer_reward"
    assert exact.__code__ is make_accuracy_reward().__code__
    assert task.reward_funcs["format"].__code__ is make_format_reward().__code__
    assert re.fullmatch(ARITHMETIC_FORMAT_PATTERN, "7+5=12,4+8+1=13,3+2+1=6<answer>632</answer>")
    # An unparseable gold answer cannot be graded: None, not 0 (the accuracy reward's contract).
    assert exact(None, ["<answer>1</answer>"], None, solution=[""]) == [None]


def test_registry():
    task = get_task("arithmetic")
    assert isinstance(task, Task) and task.name == "arithmetic"
    assert set(task.default_reward_weights) == set(task.reward_funcs) == {"exact_answer", "format"}
    assert task.reward_funcs[task.correctness_reward] is arithmetic_exact_answer_reward
    train, test = task.make_splits(seed=0, num_train=10, num_test=5)
    assert len(train) == 10 and len(test) == 5
    assert task.process_reward_funcs == {}
    chain = get_task("chain")
    assert set(chain.process_reward_funcs) == {"chain_steps", "chain_steps_local"}
    assert chain.correctness_reward in chain.reward_funcs
    with pytest.raises(KeyError, match="arithmetic"):
        get_task("no-such-task")
