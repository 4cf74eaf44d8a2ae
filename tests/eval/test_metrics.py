"""pass@k, maj@k, mean@k against values worked out by hand."""

from __future__ import annotations

from math import comb

import pytest

from grpokit.eval import maj_at_k, majority_vote, mean_at_k, mean_pass_at_k, pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5) = 1 - 21/252
        (8, 1, 1, 1 / 8),  # pass@1 = c/n
        (8, 3, 1, 3 / 8),
        (4, 0, 2, 0.0),  # nothing correct
        (4, 4, 1, 1.0),  # everything correct
        (5, 3, 3, 1.0),  # n - c = 2 < k = 3: every draw of 3 holds a correct one
        (8, 2, 8, 1.0),
    ],
)
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_binomial_formula():
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)


def test_pass_at_k_refuses_bad_arguments():
    with pytest.raises(ValueError):
        pass_at_k(5, 6, 1)
    with pytest.raises(ValueError):
        pass_at_k(5, 2, 6)
    with pytest.raises(ValueError):
        pass_at_k(5, 2, 0)


def test_mean_pass_at_k_and_mean_at_k():
    correct = [[True, False, False, False], [True, True, False, False], [False] * 4]
    # pass@2 per prompt: 1 - C(3,2)/C(4,2) = 1/2; 1 - C(2,2)/C(4,2) = 5/6; 0 -> mean 4/9
    assert mean_pass_at_k(correct, 2) == pytest.approx((1 / 2 + 5 / 6 + 0) / 3)
    # mean@4: (1/4 + 2/4 + 0) / 3 = 1/4
    assert mean_at_k(correct) == pytest.approx(0.25)


def test_majority_vote_and_maj_at_k():
    assert majority_vote(["3", "5", "5", None]) == "5"
    assert majority_vote(["3", "5", None, None]) == "3"  # tie -> first seen; None casts no vote
    assert majority_vote([None, None]) is None
    answers = [
        ["5", "5", "4", None],  # majority 5 == gold 5: hit
        ["1", "2", "2", "2"],  # majority 2 != gold 1: miss (even though one sample was right)
        [None, None, None, "9"],  # only vote 9 == gold 9: hit
        [None, None, None, None],  # no answer: miss
    ]
    assert maj_at_k(answers, ["5", "1", "9", "0"]) == pytest.approx(2 / 4)
    with pytest.raises(ValueError):
        maj_at_k(answers, ["5"])
