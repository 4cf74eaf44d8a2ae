"""Adaptive group sizes checked against hand arithmetic (in the comments), plus invariants."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpokit.core import allocate_group_sizes
from grpokit.core.group_sizes import pass_rate_uncertainty


def test_uncertainty_is_the_pass_fail_std():
    assert pass_rate_uncertainty(None) == 0.5 == pass_rate_uncertainty(0.5)
    assert pass_rate_uncertainty(0.1) == pytest.approx(0.3)  # sqrt(0.1 * 0.9) = sqrt(0.09)
    assert pass_rate_uncertainty(0.0) == 0.0 == pass_rate_uncertainty(1.0)


def test_exact_proportional_split():
    # u = [0.5 (unseen), 0.5, 0.3, 0.3], sum 1.6; 16 * u / 1.6 = [5, 5, 3, 3], all within [2, 8]
    assert allocate_group_sizes([None, 0.5, 0.1, 0.9], budget=16, min_size=2, max_size=8) == [5, 5, 3, 3]


def test_largest_remainder_rounding():
    # u = [0.5, 0.4, 0.3] (p = 0.5, 0.2, 0.1), sum 1.2; 10 * u / 1.2 = [4.167, 3.333, 2.5]
    # floors [4, 3, 2] sum 9; the one left goes to the largest fraction, 0.5 (prompt 2)
    assert allocate_group_sizes([0.5, 0.2, 0.1], budget=10, min_size=2, max_size=8) == [4, 3, 3]
    # budget 11: [4.583, 3.667, 2.75] -> floors [4, 3, 2] sum 9; two left: fractions 0.75 (2), 0.667 (1)
    assert allocate_group_sizes([0.5, 0.2, 0.1], budget=11, min_size=2, max_size=8) == [4, 4, 3]


def test_ties_go_to_the_lower_index():
    # three equal prompts, 10 / 3 = 3.333 each: floors 9, the one left to prompt 0
    assert allocate_group_sizes([0.5, 0.5, 0.5], budget=10, min_size=2, max_size=8) == [4, 3, 3]
    assert allocate_group_sizes([None, 0.5, None], budget=11, min_size=2, max_size=8) == [4, 4, 3]


def test_a_prompt_over_the_maximum_keeps_the_maximum():
    # u = [0.5, 0.14] (sqrt(0.02 * 0.98) = 0.14), sum 0.64: 8 * 0.5 / 0.64 = 6.25 > max 6 -> 6;
    # the other gets the remaining 2 (= min)
    assert allocate_group_sizes([None, 0.02], budget=8, min_size=2, max_size=6) == [6, 2]


def test_prompts_under_the_minimum_keep_the_minimum_and_the_rest_is_shared():
    # u = [0.5, 0.5, 0.0995, 0.0995] (sqrt(0.01 * 0.99)), sum 1.199: the settled prompts' shares 1.33 < 2,
    # so they keep 2 each and the two uncertain ones share 16 - 4 = 12 equally
    assert allocate_group_sizes([0.5, 0.5, 0.01, 0.99], budget=16, min_size=2, max_size=8) == [6, 6, 2, 2]
    # water-filling, not clamp-and-repair: u = [0.5, 0.4, 0.0995]; the last gets 2, then 12 is split
    # 0.5 : 0.4 -> [6.667, 5.333] -> floors [6, 5], the one left to the larger fraction (prompt 0)
    assert allocate_group_sizes([0.5, 0.2, 0.01], budget=14, min_size=2, max_size=8) == [7, 5, 2]


def test_settled_prompts_split_as_equally_as_possible():
    # every u = 0: 10 / 4 = 2.5 each -> [3, 3, 2, 2]
    assert allocate_group_sizes([0.0, 1.0, 0.0, 1.0], budget=10, min_size=2, max_size=8) == [3, 3, 2, 2]
    # every u = sqrt(0.01 * 0.99): 7 / 3 = 2.333 -> [3, 2, 2]
    assert allocate_group_sizes([0.01, 0.99, 0.01], budget=7, min_size=2, max_size=8) == [3, 2, 2]


def test_settled_prompts_share_what_the_uncertain_ones_cannot_take():
    # prompt 1 takes its maximum 8; prompt 0 (u = 0) would keep the minimum 2 but 12 - 8 = 4 remains
    assert allocate_group_sizes([0.0, 0.5], budget=12, min_size=2, max_size=8) == [4, 8]
    assert allocate_group_sizes([0.0, 0.5, 1.0], budget=17, min_size=2, max_size=8) == [5, 8, 4]


def test_budgets_at_the_bounds():
    assert allocate_group_sizes([0.5, 0.1, None], budget=6, min_size=2, max_size=8) == [2, 2, 2]
    assert allocate_group_sizes([0.5, 0.1, None], budget=24, min_size=2, max_size=8) == [8, 8, 8]
    assert allocate_group_sizes([], budget=0, min_size=2, max_size=8) == []


def test_infeasible_budgets_are_refused_naming_budget():
    with pytest.raises(ValueError, match=r"budget=5 .*smaller than 3 group\(s\) of min_size=2 \(6\)"):
        allocate_group_sizes([0.5, 0.5, 0.5], budget=5, min_size=2, max_size=8)
    with pytest.raises(ValueError, match=r"budget=25 .*larger than 3 group\(s\) of max_size=8 \(24\)"):
        allocate_group_sizes([0.5, 0.5, 0.5], budget=25, min_size=2, max_size=8)
    with pytest.raises(ValueError, match="budget=4"):
        allocate_group_sizes([], budget=4, min_size=2, max_size=8)


@pytest.mark.parametrize("bad", [-0.1, 1.5, math.nan])
def test_pass_rates_outside_0_1_are_refused(bad):
    with pytest.raises(ValueError, match="pass_rates"):
        allocate_group_sizes([0.5, bad], budget=8, min_size=2, max_size=8)


def test_bounds_are_checked():
    with pytest.raises(ValueError, match="min_size"):
        allocate_group_sizes([0.5], budget=1, min_size=0, max_size=8)
    with pytest.raises(ValueError, match="max_size"):
        allocate_group_sizes([0.5], budget=4, min_size=4, max_size=3)


rate = st.one_of(st.none(), st.floats(0.0, 1.0))


@st.composite
def problems(draw):
    rates = draw(st.lists(rate, min_size=1, max_size=24))
    low = draw(st.integers(1, 4))
    high = draw(st.integers(low, low + 12))
    budget = draw(st.integers(low * len(rates), high * len(rates)))
    return rates, budget, low, high


@settings(max_examples=300, deadline=None)
@given(problems())
def test_sizes_are_within_bounds_and_sum_to_the_budget(problem):
    rates, budget, low, high = problem
    sizes = allocate_group_sizes(rates, budget, low, high)
    assert len(sizes) == len(rates)
    assert all(isinstance(s, int) for s in sizes)
    assert sum(sizes) == budget
    assert all(low <= s <= high for s in sizes)
    assert allocate_group_sizes(rates, budget, low, high) == sizes  # deterministic


@settings(max_examples=300, deadline=None)
@given(problems())
def test_a_more_uncertain_prompt_never_gets_fewer(problem):
    rates, budget, low, high = problem
    sizes = allocate_group_sizes(rates, budget, low, high)
    u = [pass_rate_uncertainty(p) for p in rates]
    for i in range(len(rates)):
        for j in range(len(rates)):
            if u[i] > u[j] + 1e-6:
                assert sizes[i] >= sizes[j], (i, j, sizes)


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(st.none(), st.floats(0.0, 1.0)),
    st.integers(1, 30),
    st.integers(1, 4),
    st.integers(0, 12),
    st.data(),
)
def test_equally_uncertain_prompts_get_sizes_as_equal_as_possible(p, count, low, extra, data):
    high = low + extra
    budget = data.draw(st.integers(low * count, high * count))
    sizes = allocate_group_sizes([p] * count, budget, low, high)
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the extra ones go to the lowest indices
