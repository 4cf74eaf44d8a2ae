"""reward_metrics / step_metrics on ragged groups (``group_sizes``), checked with plain-Python statistics."""

import math
import statistics

import pytest
import torch

from grpokit.reporting.metrics import PhaseTimer, reward_metrics, step_metrics
from grpokit.rollout.base import GenerationOutput
from grpokit.rollout.records import Scores

NAN = float("nan")


def test_reward_metrics_ragged_by_hand():
    # Sizes [2, 3, 4]; two reward functions, weights 1 (the combined column is their NaN-skipping sum).
    a = [1.0, 0.0, 1.0, 1.0, NAN, 0.5, 0.5, 0.5, 0.5]
    b = [0.0, 0.0, 1.0, 0.0, NAN, NAN, NAN, NAN, NAN]
    combined = [1.0, 0.0, 2.0, 1.0, NAN, 0.5, 0.5, 0.5, 0.5]
    matrix = torch.tensor([a, b]).T  # [9, 2]
    metrics = reward_metrics(matrix, torch.tensor(combined), ["a", "b"], group_sizes=[2, 3, 4])
    # Group stds (a row with no reward at all counts as 0 here):
    # group 0 = [1, 0]: stdev sqrt(0.5); group 1 = [2, 1, 0]: mean 1, var (1 + 0 + 1) / 2 = 1;
    # group 2 = [0.5] * 4: 0 (the only zero-std group of three).
    stds = [statistics.stdev([1.0, 0.0]), statistics.stdev([2.0, 1.0, 0.0]), 0.0]
    assert stds[:2] == pytest.approx([math.sqrt(0.5), 1.0])
    assert metrics["reward_std"] == pytest.approx(sum(stds) / 3, abs=1e-6)
    assert metrics["frac_reward_zero_std"] == pytest.approx(1 / 3)
    # reward: mean of the eight rows that have a reward = 6 / 8.
    assert metrics["reward"] == pytest.approx(0.75)
    assert metrics["rewards/a/mean"] == pytest.approx(statistics.mean([x for x in a if not math.isnan(x)]))
    assert metrics["rewards/b/std"] == pytest.approx(statistics.stdev([0.0, 0.0, 1.0, 0.0]), abs=1e-6)


def test_ragged_sizes_change_the_group_statistics():
    # The same six rewards as [3, 3] and as [2, 4]: different groups, different stds.
    combined = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    matrix = combined[:, None]  # [6, 1]
    equal = reward_metrics(matrix, combined, ["r"], 3)
    ragged = reward_metrics(matrix, combined, ["r"], group_sizes=[2, 4])
    # [1, 1, 0] and [0, 0, 0]: stds [stdev([1, 1, 0]), 0], one of two groups has zero std.
    assert equal["reward_std"] == pytest.approx(statistics.stdev([1.0, 1.0, 0.0]) / 2, abs=1e-6)
    assert equal["frac_reward_zero_std"] == 0.5
    # [1, 1] and [0, 0, 0, 0]: both groups have zero std.
    assert ragged["reward_std"] == 0.0
    assert ragged["frac_reward_zero_std"] == 1.0


@pytest.mark.parametrize("seed", range(3))
def test_equal_group_sizes_match_the_group_size_call(seed):
    g = torch.Generator().manual_seed(seed)
    matrix = torch.randn(24, 2, generator=g)
    matrix[torch.rand(24, 2, generator=g) < 0.2] = NAN
    combined = torch.nansum(matrix, dim=1)  # [24]
    old = reward_metrics(matrix, combined, ["a", "b"], 4)
    new = reward_metrics(matrix, combined, ["a", "b"], group_sizes=[4] * 6)
    both = reward_metrics(matrix, combined, ["a", "b"], 4, group_sizes=[4] * 6)
    assert old.keys() == new.keys() == both.keys()
    for key, value in old.items():
        assert new[key] == pytest.approx(value, abs=1e-6) and both[key] == new[key]


def test_reward_metrics_refuses_bad_group_sizes():
    combined = torch.zeros(5)
    with pytest.raises(ValueError, match="group_sizes sum to 4"):
        reward_metrics(combined[:, None], combined, ["r"], group_sizes=[2, 2])
    with pytest.raises(ValueError, match=r"group_sizes\[0\] = 1"):
        reward_metrics(combined[:, None], combined, ["r"], group_sizes=[1, 4])
    with pytest.raises(ValueError, match="disagree"):
        reward_metrics(combined[:, None], combined, ["r"], 5, group_sizes=[2, 3])


def test_step_metrics_passes_group_sizes_through():
    combined = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.5])
    scores = Scores(combined[:, None], combined, torch.zeros(5), {}, slice(0, 5))
    generated = GenerationOutput(completion_ids=[[1, 2], [3], [4, 5, 6], [7], [8]])
    metrics = step_metrics(
        scores=scores,
        reward_names=["r"],
        group_size=None,
        group_sizes=[2, 3],
        generated=generated,
        update={"loss": 0.0},
        extra={},
        learning_rate=1e-6,
        num_tokens=8,
        timer=PhaseTimer(),
    )
    # Group 0 = [1, 0]: stdev sqrt(0.5); group 1 = [0.5] * 3: zero std.
    assert metrics["reward_std"] == pytest.approx(math.sqrt(0.5) / 2, abs=1e-6)
    assert metrics["frac_reward_zero_std"] == 0.5
