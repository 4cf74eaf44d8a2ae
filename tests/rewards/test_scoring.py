"""score_completions: the reward matrix, None handling, failure policy, async functions, names."""

import asyncio
import functools
import math
import time

import pytest
import torch

from grpokit.rewards import RewardFunctionError, combine_rewards, reward_name, reward_names, score_completions

PROMPTS = ["p0", "p1", "p2"]
COMPLETIONS = ["c0", "c1", "c2"]
IDS = [[1], [1, 2], [1, 2, 3]]


def constant(*values):
    def func(prompts, completions, completion_ids, **kwargs):
        return list(values)

    return func


def score(funcs, **kwargs):
    return score_completions(
        funcs, PROMPTS, COMPLETIONS, IDS, columns={"solution": ["a", "b", "c"]}, **kwargs
    )


def test_matrix_with_none_as_nan_and_weighted_sum_skips_it():
    matrix, failures = score([constant(1.0, None, 0.5), constant(2, 3, None)])
    assert matrix.shape == (3, 2) and matrix.dtype == torch.float32
    assert matrix[0].tolist() == [1.0, 2.0]
    assert math.isnan(matrix[1, 0]) and math.isnan(matrix[2, 1])
    assert failures == {"func": 0, "func_2": 0}
    # weights 1 and 0.5: row 0 = 1 + 1, row 1 = 0.5 * 3 (None skipped, not 0), row 2 = 0.5
    assert combine_rewards(matrix, torch.tensor([1.0, 0.5])).tolist() == [2.0, 1.5, 0.5]


def test_columns_and_trainer_state_reach_the_function():
    seen = {}

    def spy(prompts, completions, completion_ids, solution, trainer_state, **kwargs):
        seen.update(prompts=prompts, ids=completion_ids, solution=solution, state=trainer_state)
        return [0.0] * len(completions)

    score([spy], trainer_state={"global_step": 7})
    assert seen == {"prompts": PROMPTS, "ids": IDS, "solution": ["a", "b", "c"], "state": {"global_step": 7}}


def boom(prompts, completions, completion_ids, **kwargs):
    raise ZeroDivisionError("division by zero")


@pytest.mark.parametrize(
    ("func", "message", "row"),
    [
        (boom, "'boom'.*raised ZeroDivisionError", None),
        (constant(1.0, 2.0), "returned 2 values for 3 completions", None),
        (constant(1.0, float("nan"), 0.0), "row 1.*nan", 1),
        (constant(1.0, 0.0, float("inf")), "row 2.*inf", 2),
        (constant("1.0", 0.0, 0.0), "row 0.*'1.0'.*not a number", 0),
        (constant([1.0], 0.0, 0.0), "row 0.*not a number", 0),
    ],
    ids=["raises", "wrong-count", "nan", "inf", "string", "list"],
)
def test_failures_raise_with_name_row_and_value(func, message, row):
    with pytest.raises(RewardFunctionError, match=message) as info:
        score([constant(0.0, 0.0, 0.0), func])
    assert info.value.row == row


def test_on_error_none_counts_failures_and_never_writes_zero():
    funcs = [boom, constant(1.0, float("nan"), "x"), constant(1.0, 2.0)]
    matrix, failures = score(funcs, on_error="none")
    assert failures == {"boom": 3, "func": 2, "func_2": 3}
    assert torch.isnan(matrix[:, 0]).all() and torch.isnan(matrix[:, 2]).all()
    assert matrix[0, 1] == 1.0 and torch.isnan(matrix[1:, 1]).all()


def test_bad_arguments():
    with pytest.raises(ValueError, match="on_error"):
        score([constant(0, 0, 0)], on_error="zero")
    with pytest.raises(ValueError, match="column 'solution'"):
        score_completions([constant(0, 0, 0)], PROMPTS, COMPLETIONS, IDS, columns={"solution": ["a"]})


def test_tensor_and_numpy_like_returns_are_accepted():
    matrix, _ = score([lambda **kw: torch.tensor([1.0, 2.0, 3.0]), lambda **kw: (True, False, 1)])
    assert matrix.tolist() == [[1.0, 1.0], [2.0, 0.0], [3.0, 1.0]]


def test_async_functions_run_concurrently():
    async def slow(prompts, completions, completion_ids, **kwargs):
        await asyncio.sleep(2.0)
        return [1.0] * len(completions)

    async def failing(prompts, completions, completion_ids, **kwargs):
        await asyncio.sleep(2.0)
        raise RuntimeError("judge unavailable")

    start = time.monotonic()
    matrix, failures = score([slow, constant(2.0, 2.0, 2.0), slow, failing], on_error="none")
    assert time.monotonic() - start < 4.0  # gathered: ~2 s, not the 6 s of one after the other
    assert matrix[:, :3].tolist() == [[1.0, 2.0, 1.0]] * 3
    assert failures["failing"] == 3


def test_async_functions_work_inside_a_running_event_loop():
    async def judge(prompts, completions, completion_ids, **kwargs):
        return [0.5] * len(completions)

    async def main():
        return score([judge])

    matrix, _ = asyncio.run(main())
    assert matrix[:, 0].tolist() == [0.5] * 3


class LengthReward:
    def __call__(self, prompts, completions, completion_ids, **kwargs):
        return [float(len(ids)) for ids in completion_ids]


def test_reward_names():
    def my_reward(**kwargs):
        return []

    assert reward_name(my_reward) == "my_reward"
    assert reward_name(lambda **kw: []) == "lambda"
    assert reward_name(functools.partial(my_reward, x=1)) == "my_reward"
    assert reward_name(LengthReward()) == "LengthReward"
    assert reward_names([my_reward, my_reward, LengthReward(), my_reward]) == [
        "my_reward",
        "my_reward_2",
        "LengthReward",
        "my_reward_3",
    ]
    matrix, failures = score([LengthReward()])
    assert matrix[:, 0].tolist() == [1.0, 2.0, 3.0] and failures == {"LengthReward": 0}
