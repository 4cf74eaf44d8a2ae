"""Advantages checked against hand arithmetic (written out in the comments), plus invariants."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpokit.core import combine_rewards, group_advantages, multi_reward_advantages, process_advantages

NAN = float("nan")
EPS = 1e-4


def close(actual: torch.Tensor, expected: list[float], tol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), rtol=0.0, atol=tol)


def test_seeds_check_value():
    # Group 1 = [1,0,0,1]: mean 0.5, deviations +-0.5, unbiased var = 4 * 0.25 / 3 = 1/3, std = 0.57735.
    # 0.5 / (0.57735 + 1e-4) = 0.8659. Group 2 = [1,1,1,1]: all equal -> 0.
    adv = group_advantages(torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 1]), group_size=4)
    assert adv.dtype == torch.float32
    close(adv, [0.8659, -0.8659, -0.8659, 0.8659, 0, 0, 0, 0], tol=1e-4)
    a = 0.5 / (math.sqrt(1 / 3) + EPS)
    close(adv, [a, -a, -a, a, 0, 0, 0, 0])


REWARDS = [0.0, 1, 2, 3, 0, 0, 0, 4]
# Group 1 = [0,1,2,3]: mean 1.5, deviations [-1.5,-0.5,0.5,1.5].
# Group 2 = [0,0,0,4]: mean 1.0, deviations [-1,-1,-1,3].
DEVIATIONS = [-1.5, -0.5, 0.5, 1.5, -1, -1, -1, 3]


def test_group_scale_by_hand():
    # Group 1: var = (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3, std = 1.2909944.
    # Group 2: var = (1 + 1 + 1 + 9) / 3 = 4, std = 2.
    s1, s2 = math.sqrt(5 / 3) + EPS, 2.0 + EPS
    expected = [d / s1 for d in DEVIATIONS[:4]] + [d / s2 for d in DEVIATIONS[4:]]
    close(group_advantages(torch.tensor(REWARDS), 4, "group"), expected)


def test_batch_scale_by_hand():
    # Batch mean = 10 / 8 = 1.25. Squared deviations from 1.25:
    # 1.5625 + 0.0625 + 0.5625 + 3.0625 + 3 * 1.5625 + 7.5625 = 17.5; unbiased var = 17.5 / 7 = 2.5.
    # The group mean stays the centre: A = (r - group mean) / (sqrt(2.5) + eps).
    s = math.sqrt(2.5) + EPS
    close(group_advantages(torch.tensor(REWARDS), 4, "batch"), [d / s for d in DEVIATIONS])


def test_none_scale_by_hand():
    # Dr. GRPO: only the group mean is subtracted.
    close(group_advantages(torch.tensor(REWARDS), 4, "none"), DEVIATIONS)


def test_nan_rewards_are_left_out():
    rewards = torch.tensor([1.0, NAN, 0, 1, NAN, NAN, NAN, 5])
    # Group 1 valid = [1, 0, 1]: mean 2/3, deviations [1/3, -2/3, 1/3],
    # unbiased var = (1/9 + 4/9 + 1/9) / 2 = 1/3. The NaN row gets 0.
    # Group 2 has a single valid reward: no baseline, every row 0.
    s = math.sqrt(1 / 3) + EPS
    close(group_advantages(rewards, 4, "group"), [1 / 3 / s, 0, -2 / 3 / s, 1 / 3 / s, 0, 0, 0, 0])
    close(group_advantages(rewards, 4, "none"), [1 / 3, 0, -2 / 3, 1 / 3, 0, 0, 0, 0])
    # Batch std over the valid [1, 0, 1, 5]: mean 1.75, squared deviations
    # 0.5625 + 3.0625 + 0.5625 + 10.5625 = 14.75, var = 14.75 / 3.
    b = math.sqrt(14.75 / 3) + EPS
    close(group_advantages(rewards, 4, "batch"), [1 / 3 / b, 0, -2 / 3 / b, 1 / 3 / b, 0, 0, 0, 0])


def test_all_nan_group_is_zero_not_nan():
    adv = group_advantages(torch.tensor([NAN, NAN, 1.0, 2.0]), 2)
    # Group 2 = [1, 2]: mean 1.5, deviations -+0.5, var = 0.5 / 1, std = 0.70711.
    s = math.sqrt(0.5) + EPS
    close(adv, [0, 0, -0.5 / s, 0.5 / s])


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("value", [0.1, 0.7, 1 / 3, -2.5, 1e6])
def test_equal_rewards_give_exactly_zero(scale, value):
    rewards = torch.tensor([value] * 3 + [0.0, 1.0, 0.0])
    adv = group_advantages(rewards, 3, scale)
    assert torch.equal(adv[:3], torch.zeros(3))


@settings(max_examples=60, deadline=None)
@given(
    group_size=st.integers(2, 6),
    num_groups=st.integers(1, 4),
    scale=st.sampled_from(["group", "batch", "none"]),
    data=st.data(),
)
def test_advantages_sum_to_zero_per_group(group_size, num_groups, scale, data):
    values = data.draw(
        st.lists(
            st.floats(-10, 10, allow_nan=False, width=32),
            min_size=group_size * num_groups,
            max_size=group_size * num_groups,
        )
    )
    adv = group_advantages(torch.tensor(values), group_size, scale)
    sums = adv.view(num_groups, group_size).sum(dim=1)
    # |A| <= G for scale group/batch and <= 20 for none; float32 rounding stays far below 1e-3.
    torch.testing.assert_close(sums, torch.zeros(num_groups), rtol=0.0, atol=1e-3)


def test_group_advantages_validation():
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.zeros(6), 1)
    with pytest.raises(ValueError, match="scale"):
        group_advantages(torch.zeros(4), 2, scale="std")
    with pytest.raises(ValueError, match="rewards"):
        group_advantages(torch.zeros(4, 1), 2)


def test_group_advantages_any_input_dtype():
    adv = group_advantages(torch.tensor([1, 0, 0, 1], dtype=torch.bfloat16), 4)
    assert adv.dtype == torch.float32
    a = 0.5 / (math.sqrt(1 / 3) + EPS)
    close(adv, [a, -a, -a, a])


def test_combine_rewards_by_hand():
    rewards = torch.tensor([[1.0, NAN], [NAN, NAN], [2.0, 3.0]])
    # Row 0: 0.5 * 1 (the NaN is skipped, not counted as 0) = 0.5. Row 1: no reward at all -> NaN.
    # Row 2: 0.5 * 2 + 2 * 3 = 7.
    out = combine_rewards(rewards, torch.tensor([0.5, 2.0]))
    assert out[0].item() == 0.5 and math.isnan(out[1].item()) and out[2].item() == 7.0
    # No weights = all ones: row 2 = 2 + 3.
    assert combine_rewards(rewards, None)[2].item() == 5.0
    with pytest.raises(ValueError, match="weights"):
        combine_rewards(rewards, torch.ones(3))


def test_sum_then_normalize_is_group_advantages_of_the_weighted_sum():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, NAN], [1.0, 1.0]])
    # Weighted sums with weights [1, 0.5]: [1, 1, 1, 1.5]. Group 1 = [1, 1]: equal -> 0.
    # Group 2 = [1, 1.5]: mean 1.25, deviations -+0.25, var = 0.125 / 1, std = 0.35355.
    s = math.sqrt(0.125) + EPS
    adv = multi_reward_advantages(rewards, torch.tensor([1.0, 0.5]), 2)
    close(adv, [0, 0, -0.25 / s, 0.25 / s])


def test_normalize_then_sum_by_hand():
    # GDPO: columns normalised within their group, weighted sum, then batch standardisation.
    rewards = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 3.0], [1.0, 1.0]])
    w = [1.0, 0.5]
    # Column A, group 1 = [1, 0]: mean 0.5, deviations +-0.5, var 0.5 -> a = +-0.5 / (sqrt(0.5) + eps).
    # Column A, group 2 = [1, 1]: equal -> 0.
    a = 0.5 / (math.sqrt(0.5) + EPS)
    # Column B, group 1 = [0, 2]: mean 1, deviations -+1, var 2 -> b = -+1 / (sqrt(2) + eps).
    # Column B, group 2 = [3, 1]: mean 2, deviations +-1, var 2 -> b = +-1 / (sqrt(2) + eps).
    b = 1.0 / (math.sqrt(2.0) + EPS)
    summed = [a - w[1] * b, -a + w[1] * b, w[1] * b, -w[1] * b]
    mean = sum(summed) / 4  # = 0 up to rounding
    std = math.sqrt(sum((x - mean) ** 2 for x in summed) / 3)
    expected = [(x - mean) / (std + EPS) for x in summed]
    adv = multi_reward_advantages(rewards, torch.tensor(w), 2, aggregation="normalize_then_sum")
    close(adv, expected)


def test_normalize_then_sum_skips_nan_entries_and_rows():
    rewards = torch.tensor([[1.0, NAN], [0.0, NAN], [NAN, NAN], [NAN, 4.0]])
    # Column A, group 1 = [1, 0] -> +-0.5 / (sqrt(0.5) + eps) = +-a; column B is NaN there, skipped.
    # Group 2: row 2 has no reward (NaN, advantage 0); column B has one valid value -> 0 for row 3.
    a = 0.5 / (math.sqrt(0.5) + EPS)
    # Summed, valid rows only: [a, -a, 0]. Mean 0, unbiased var = 2 a^2 / 2 = a^2, std = a.
    adv = multi_reward_advantages(rewards, None, 2, aggregation="normalize_then_sum")
    close(adv, [a / (a + EPS), -a / (a + EPS), 0, 0])


def test_multi_reward_validation():
    with pytest.raises(ValueError, match="aggregation"):
        multi_reward_advantages(torch.zeros(4, 2), None, 2, aggregation="mean")
    with pytest.raises(ValueError, match="group_size"):
        multi_reward_advantages(torch.zeros(5, 2), None, 2, aggregation="normalize_then_sum")


def test_process_supervision_by_hand():
    step_rewards = [[1.0, 0.25], [0.5, 0.0], [3.0], []]
    step_ends = [[1, 4], [2, 3], [0], []]
    adv = process_advantages(step_rewards, step_ends, group_size=2, num_tokens=6)
    assert adv.shape == (4, 6) and adv.dtype == torch.float32
    # Group 1: R = [1, 0.25, 0.5, 0], mean = 1.75 / 4 = 0.4375, deviations [0.5625, -0.1875, 0.0625, -0.4375],
    # squares sum 0.31640625 + 0.03515625 + 0.00390625 + 0.19140625 = 0.546875, var = 0.546875 / 3.
    d = math.sqrt(0.546875 / 3) + EPS
    # Row 0: steps end at tokens 1 and 4. t <= 1: both steps, (0.5625 - 0.1875) / d; 2 <= t <= 4: second step;
    # t = 5 lies after the last step: 0.
    row0 = [0.375 / d] * 2 + [-0.1875 / d] * 3 + [0.0]
    # Row 1: steps end at 2 and 3. t <= 2: (0.0625 - 0.4375) / d; t = 3: -0.4375 / d; t >= 4: 0.
    row1 = [-0.375 / d] * 3 + [-0.4375 / d] + [0.0] * 2
    # Group 2: R = [3] has one value: normalised = r - mean = 0; row 3 has no steps. All zeros.
    expected = torch.tensor([row0, row1, [0.0] * 6, [0.0] * 6])
    torch.testing.assert_close(adv, expected, rtol=0.0, atol=1e-5)


def test_process_supervision_equal_step_rewards_use_r_minus_mean():
    # R = [2, 2, 2]: std 0 -> normalised r - mean = 0 everywhere (no division by eps).
    adv = process_advantages([[2.0, 2.0], [2.0]], [[0, 2], [1]], group_size=2, num_tokens=3)
    assert torch.equal(adv, torch.zeros(2, 3))


def test_process_supervision_device_dtype():
    adv = process_advantages([[1.0], [0.0]], [[0], [0]], 2, 2, device="cpu", dtype=torch.float64)
    assert adv.dtype == torch.float64
    # R = [1, 0]: mean 0.5, var 0.5 -> +-0.5 / (sqrt(0.5) + eps) on token 0 only.
    a = 0.5 / (math.sqrt(0.5) + EPS)
    torch.testing.assert_close(adv, torch.tensor([[a, 0.0], [-a, 0.0]], dtype=torch.float64))


def test_process_supervision_validation():
    with pytest.raises(ValueError, match="row 1"):
        process_advantages([[1.0], [1.0, 2.0]], [[0], [3, 1]], 2, 5)  # decreasing ends
    with pytest.raises(ValueError, match="row 0"):
        process_advantages([[1.0], [1.0]], [[5], [0]], 2, 5)  # end == num_tokens
    with pytest.raises(ValueError, match="row 1"):
        process_advantages([[1.0], [1.0]], [[0], [0, 1]], 2, 5)  # length mismatch
    with pytest.raises(ValueError, match="step_ends"):
        process_advantages([[1.0], [1.0]], [[0]], 2, 5)
    with pytest.raises(ValueError, match="group_size"):
        process_advantages([[1.0]] * 3, [[0]] * 3, 2, 5)
