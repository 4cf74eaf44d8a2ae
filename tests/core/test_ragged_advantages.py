"""Ragged groups (``group_sizes``) checked against hand arithmetic and plain-Python ``statistics``, plus the
equal-size equivalence with ``group_size`` (bit for bit) and the argument checks."""

import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpokit.core import (
    group_advantages,
    group_mean_std,
    multi_reward_advantages,
    pad_groups,
    process_advantages,
    resolve_group_sizes,
    unpad_groups,
)

NAN = float("nan")
EPS = 1e-4


def close(actual: torch.Tensor, expected: list[float], tol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), rtol=0.0, atol=tol)


def standardise(values: list[float], eps: float = EPS) -> list[float]:
    """(x - mean) / (stdev + eps) with the statistics module (Bessel std): the reference, not the code."""
    mean, std = statistics.mean(values), statistics.stdev(values)
    return [(x - mean) / (std + eps) for x in values]


# Sizes [2, 3, 4]: rows 0-1 are group 0, rows 2-4 group 1, rows 5-8 group 2.
SIZES = [2, 3, 4]
REWARDS = [1.0, 0.0, 1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 4.0]
# Group 0 = [1, 0]:       mean 0.5, deviations [0.5, -0.5],       var = 0.5 / 1 = 0.5, std = 0.7071068.
# Group 1 = [1, 2, 3]:    mean 2,   deviations [-1, 0, 1],        var = 2 / 2 = 1,     std = 1.
# Group 2 = [0, 0, 0, 4]: mean 1,   deviations [-1, -1, -1, 3],   var = 12 / 3 = 4,    std = 2.
DEVIATIONS = [0.5, -0.5, -1.0, 0.0, 1.0, -1.0, -1.0, -1.0, 3.0]


def test_ragged_group_scale_literal_numbers():
    # 0.5 / (0.7071068 + 1e-4) = 0.7070068; 1 / 1.0001 = 0.9999000; 1 / 2.0001 = 0.4999750;
    # 3 / 2.0001 = 1.4999250.
    expected = [0.7070068, -0.7070068, -0.9999, 0.0, 0.9999, -0.499975, -0.499975, -0.499975, 1.499925]
    adv = group_advantages(torch.tensor(REWARDS), group_sizes=SIZES)
    assert adv.shape == (9,) and adv.dtype == torch.float32
    close(adv, expected, tol=1e-6)
    # The same numbers from statistics.stdev, group by group.
    by_stats = standardise(REWARDS[:2]) + standardise(REWARDS[2:5]) + standardise(REWARDS[5:])
    close(adv, by_stats)
    assert statistics.stdev(REWARDS[:2]) == pytest.approx(math.sqrt(0.5))


def test_ragged_batch_and_none_scale_by_hand():
    # "batch": the group mean stays the centre, the divisor is the Bessel std of all nine rewards:
    # sum 11, sum of squares 31, squared deviations from 11/9 sum to 31 - 121/9 = 158/9, var = 158/72.
    batch_std = statistics.stdev(REWARDS)
    assert batch_std == pytest.approx(math.sqrt(158 / 72))
    close(group_advantages(torch.tensor(REWARDS), scale="batch", group_sizes=SIZES),
          [d / (batch_std + EPS) for d in DEVIATIONS])  # fmt: skip
    # "none" (Dr. GRPO): only each group's own mean is subtracted.
    close(group_advantages(torch.tensor(REWARDS), scale="none", group_sizes=SIZES), DEVIATIONS)


def test_ragged_nan_is_left_out_of_its_group():
    # Sizes [3, 2, 4]. Group 0 = [1, NaN, 0]: valid [1, 0] -> +-0.5 / (sqrt(0.5) + eps), the NaN row 0.
    # Group 1 = [7, NaN]: one valid reward, no baseline -> 0.
    # Group 2 = [2, NaN, 4, 0]: valid [2, 4, 0], mean 2, deviations [0, 2, -2], var = 8 / 2 = 4, std 2.
    rewards = torch.tensor([1.0, NAN, 0.0, 7.0, NAN, 2.0, NAN, 4.0, 0.0])
    a = 0.5 / (math.sqrt(0.5) + EPS)
    b = 2.0 / (2.0 + EPS)
    close(group_advantages(rewards, group_sizes=[3, 2, 4]), [a, 0, -a, 0, 0, 0, 0, b, -b])
    close(group_advantages(rewards, scale="none", group_sizes=[3, 2, 4]), [0.5, 0, -0.5, 0, 0, 0, 0, 2, -2])
    # Batch std over the valid [1, 0, 7, 2, 4, 0].
    s = statistics.stdev([1.0, 0.0, 7.0, 2.0, 4.0, 0.0]) + EPS
    close(group_advantages(rewards, scale="batch", group_sizes=[3, 2, 4]),
          [0.5 / s, 0, -0.5 / s, 0, 0, 0, 0, 2 / s, -2 / s])  # fmt: skip


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("value", [0.1, 1 / 3, -2.5, 1e6])
def test_all_equal_ragged_group_is_exactly_zero(scale, value):
    # Sizes [2, 5, 3]: the middle group (5 equal rewards, one NaN among them too) carries no signal.
    rewards = torch.tensor([0.0, 1.0, value, value, NAN, value, value, 1.0, 0.0, 0.5])
    adv = group_advantages(rewards, scale=scale, group_sizes=[2, 5, 3])
    assert torch.equal(adv[2:7], torch.zeros(5))
    assert (adv[:2] != 0).all() and adv[7:].abs().sum() > 0


def test_ragged_multi_reward_sum_then_normalize_by_hand():
    # Sizes [2, 3]; weights [1, 0.5]; the NaN in row 4 is skipped in the sum, not counted as 0.
    rewards = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 3.0], [0.0, 1.0], [1.0, NAN]])
    # Weighted sums: [1, 1 | 2.5, 0.5, 1]. Group 0 is all equal -> 0. Group 1: mean 4/3, deviations
    # [7/6, -5/6, -1/3], var = (49/36 + 25/36 + 4/36) / 2 = 13/12.
    s = math.sqrt(13 / 12) + EPS
    expected = [0.0, 0.0, 7 / 6 / s, -5 / 6 / s, -1 / 3 / s]
    adv = multi_reward_advantages(rewards, torch.tensor([1.0, 0.5]), group_sizes=[2, 3])
    close(adv, expected)
    close(adv, [0.0, 0.0, *standardise([2.5, 0.5, 1.0])])


def test_ragged_multi_reward_normalize_then_sum_by_hand():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 3.0], [0.0, 1.0], [1.0, NAN]])
    w = [1.0, 0.5]
    # Column A: group 0 = [1, 0], group 1 = [1, 0, 1].
    # Column B: group 0 = [0, 2], group 1 = [3, 1] (row 4's NaN skipped).
    col_a = standardise([1.0, 0.0]) + standardise([1.0, 0.0, 1.0])
    col_b = [*standardise([0.0, 2.0]), *standardise([3.0, 1.0]), None]
    # Row 4 has only column A: its sum is w_A * a_4.
    summed = [w[0] * a + (w[1] * b if b is not None else 0.0) for a, b in zip(col_a, col_b, strict=True)]
    expected = standardise(summed)  # batch-wise standardisation over the five rows
    adv = multi_reward_advantages(
        rewards, torch.tensor(w), aggregation="normalize_then_sum", group_sizes=[2, 3]
    )
    close(adv, expected)


def test_ragged_process_advantages_by_hand():
    # Sizes [2, 3]. Group 0 pools R = [1, 0, 0.2]; group 1 pools R = [2, 0, 1.5] (row 3 has no steps).
    step_rewards = [[1.0, 0.0], [0.2], [2.0], [], [0.0, 1.5]]
    step_ends = [[0, 2], [1], [1], [], [0, 3]]
    adv = process_advantages(step_rewards, step_ends, num_tokens=4, group_sizes=[2, 3])
    assert adv.shape == (5, 4) and adv.dtype == torch.float32
    # Group 0: mean 0.4, deviations [0.6, -0.4, -0.2], var = (0.36 + 0.16 + 0.04) / 2 = 0.28.
    d0 = math.sqrt(0.28) + EPS
    assert statistics.stdev([1.0, 0.0, 0.2]) == pytest.approx(math.sqrt(0.28))
    # Row 0: steps end at 0 and 2: t = 0 sums both (0.6 - 0.4), t = 1..2 the second (-0.4), t = 3 nothing.
    row0 = [0.2 / d0, -0.4 / d0, -0.4 / d0, 0.0]
    row1 = [-0.2 / d0, -0.2 / d0, 0.0, 0.0]
    # Group 1: mean 3.5 / 3, deviations [5/6, -7/6, 1/3], var = (25/36 + 49/36 + 4/36) / 2 = 13/12.
    d1 = math.sqrt(13 / 12) + EPS
    row2 = [5 / 6 / d1, 5 / 6 / d1, 0.0, 0.0]
    row3 = [0.0] * 4
    # Row 4: steps end at 0 and 3: t = 0 sums both (-7/6 + 1/3 = -5/6), t = 1..3 the second (1/3).
    row4 = [-5 / 6 / d1, 1 / 3 / d1, 1 / 3 / d1, 1 / 3 / d1]
    expected = torch.tensor([row0, row1, row2, row3, row4])
    torch.testing.assert_close(adv, expected, rtol=0.0, atol=1e-5)


def bad_group_sizes_calls(group_size, group_sizes, n=6):
    """Each public function called with the given group arguments on N = n rows."""
    return [
        lambda: group_advantages(torch.zeros(n), group_size, group_sizes=group_sizes),
        lambda: multi_reward_advantages(torch.zeros(n, 2), None, group_size, group_sizes=group_sizes),
        lambda: multi_reward_advantages(
            torch.zeros(n, 2), None, group_size, aggregation="normalize_then_sum", group_sizes=group_sizes
        ),
        lambda: process_advantages([[0.0]] * n, [[0]] * n, group_size, 3, group_sizes=group_sizes),
        lambda: group_mean_std(torch.zeros(n), group_size, group_sizes=group_sizes),
    ]


@pytest.mark.parametrize(
    ("group_size", "group_sizes", "message"),
    [
        (None, [2, 3], r"group_sizes sum to 5 but there are N=6 rows"),  # sum mismatch
        (None, [2, 2, 3], r"group_sizes sum to 7 but there are N=6 rows"),
        (None, [2, 1, 3], r"group_sizes\[1\] = 1: every group needs >= 2 rows"),  # a size < 2
        (None, [6, 0], r"group_sizes\[1\] = 0"),
        (None, [3, 3.0], r"group_sizes\[1\] must be an int"),
        (None, 6, r"group_sizes must be a sequence of ints"),
        (3, [2, 4], r"group_size=3 and group_sizes=\[2, 4\] disagree"),  # both given, disagreeing
        (None, None, r"give group_size .* or group_sizes"),  # neither
        (4, None, r"group_size=4 does not divide N=6"),  # the equal-group check is unchanged
    ],
)
def test_bad_group_sizes_are_refused_clearly(group_size, group_sizes, message):
    for call in bad_group_sizes_calls(group_size, group_sizes):
        with pytest.raises(ValueError, match=message):
            call()


def test_both_arguments_agreeing_are_accepted():
    rewards = torch.tensor(REWARDS[:6])
    assert torch.equal(
        group_advantages(rewards, 3, group_sizes=[3, 3]), group_advantages(rewards, group_size=3)
    )
    assert resolve_group_sizes(6, 3, (3, 3)) == [3, 3]
    assert resolve_group_sizes(6, None, torch.tensor([2, 4])) == [2, 4]


def random_rewards(generator: torch.Generator, n: int, nan_fraction: float = 0.2) -> torch.Tensor:
    """Rewards with repeats (0/1-like values, so equal groups occur), a spread, and some NaN."""
    values = torch.randn(n, generator=generator) * 3
    binary = torch.rand(n, generator=generator) < 0.4
    values = torch.where(binary, (values > 0).float(), values)
    nan = torch.rand(n, generator=generator) < nan_fraction
    return torch.where(nan, torch.full_like(values, NAN), values)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize(("num_groups", "group_size"), [(1, 2), (3, 4), (8, 5), (16, 16), (5, 64)])
def test_equal_sizes_are_bit_identical_to_group_size(seed, scale, num_groups, group_size):
    g = torch.Generator().manual_seed(seed)
    n = num_groups * group_size
    rewards = random_rewards(g, n)
    old = group_advantages(rewards, group_size, scale)
    assert torch.equal(group_advantages(rewards, scale=scale, group_sizes=[group_size] * num_groups), old)
    matrix = torch.stack([rewards, random_rewards(g, n)], dim=1)  # [N, 2]
    weights = torch.tensor([1.0, 0.3])
    for aggregation in ("sum_then_normalize", "normalize_then_sum"):
        old = multi_reward_advantages(matrix, weights, group_size, scale, aggregation)
        new = multi_reward_advantages(
            matrix, weights, scale=scale, aggregation=aggregation, group_sizes=[group_size] * num_groups
        )
        assert torch.equal(new, old)


@pytest.mark.parametrize("seed", range(3))
def test_process_equal_sizes_are_bit_identical_to_group_size(seed):
    g = torch.Generator().manual_seed(seed)
    step_rewards, step_ends = [], []
    for _ in range(12):
        k = int(torch.randint(0, 4, (1,), generator=g))
        step_rewards.append(torch.randn(k, generator=g).tolist())
        step_ends.append(sorted(torch.randint(0, 7, (k,), generator=g).tolist()))
    old = process_advantages(step_rewards, step_ends, 4, 7)
    new = process_advantages(step_rewards, step_ends, num_tokens=7, group_sizes=[4, 4, 4])
    assert torch.equal(new, old)


def loop_reference(rewards: list[float], sizes: list[int], scale: str) -> list[float]:
    """One group at a time in plain Python (statistics module), the NaN and all-equal rules spelled out."""
    valid_all = [r for r in rewards if not math.isnan(r)]
    batch_std = statistics.stdev(valid_all) if len(valid_all) >= 2 else 0.0
    out, start = [], 0
    for size in sizes:
        group = rewards[start : start + size]
        start += size
        valid = [r for r in group if not math.isnan(r)]
        if len(valid) < 2 or max(valid) == min(valid):
            out += [0.0] * size
            continue
        mean = statistics.mean(valid)
        denom = {"group": statistics.stdev(valid) + EPS, "batch": batch_std + EPS, "none": 1.0}[scale]
        out += [0.0 if math.isnan(r) else (r - mean) / denom for r in group]
    return out


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 7), min_size=1, max_size=6),
    scale=st.sampled_from(["group", "batch", "none"]),
    data=st.data(),
)
def test_ragged_matches_a_per_group_python_loop(sizes, scale, data):
    values = data.draw(
        st.lists(
            st.one_of(st.sampled_from([0.0, 1.0, NAN]), st.floats(-10, 10, allow_nan=False, width=32)),
            min_size=sum(sizes),
            max_size=sum(sizes),
        )
    )
    adv = group_advantages(torch.tensor(values), scale=scale, group_sizes=sizes)
    expected = loop_reference(values, sizes, scale)
    # |A| <= 20 (scale none) and <= G otherwise: float32 rounding stays far below 1e-3.
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float32), rtol=1e-4, atol=1e-3)
    # Zero-sum per group (NaN rows are 0 and out of the mean).
    for piece in torch.split(adv, sizes):
        assert abs(float(piece.sum())) < 1e-3


def test_pad_unpad_and_group_mean_std():
    values = torch.tensor(REWARDS)
    padded = pad_groups(values, SIZES)  # [3, 4]
    assert padded.shape == (3, 4)
    assert torch.equal(padded[1, :3], torch.tensor([1.0, 2.0, 3.0])) and torch.isnan(padded[0, 2:]).all()
    assert torch.equal(unpad_groups(padded, SIZES), values)
    # Equal sizes: the padded layout is the plain view.
    assert torch.equal(pad_groups(values[:6], [3, 3]), values[:6].view(2, 3))
    mean, std, count = group_mean_std(torch.tensor([1.0, NAN, 0.0, 2.0, 4.0]), group_sizes=[3, 2])
    close(mean, [0.5, 3.0])
    close(std, [statistics.stdev([1.0, 0.0]), statistics.stdev([2.0, 4.0])])
    close(count, [2.0, 2.0])


def test_ragged_on_empty_and_non_float_input():
    assert group_advantages(torch.empty(0), group_sizes=[]).shape == (0,)
    adv = group_advantages(torch.tensor([1, 0, 1, 1, 0], dtype=torch.int64), group_sizes=[2, 3])
    assert adv.dtype == torch.float32
    close(adv, standardise([1.0, 0.0]) + standardise([1.0, 1.0, 0.0]))
