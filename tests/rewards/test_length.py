"""Length shaping against hand-computed values."""

import math

import pytest

from grpokit.rewards import cosine_scaled_reward, repetition_penalty_reward, soft_overlong_punishment


def ids_of_lengths(*lengths):
    return [[7] * length for length in lengths]


def test_soft_overlong_punishment_hand_values():
    # M = 20, C = 5: zero up to 15, then (15 - L) / 5, then -1 past 20
    reward = soft_overlong_punishment(max_completion_len=20, soft_punish_cache=5)
    lengths = (0, 15, 16, 18, 20, 21, 100)
    expected = [0.0, 0.0, -0.2, -0.6, -1.0, -1.0, -1.0]
    got = reward(["p"] * 7, ["c"] * 7, ids_of_lengths(*lengths))
    assert got == pytest.approx(expected)
    assert reward.__name__ == "soft_overlong_punishment"


def test_soft_overlong_punishment_hard_cut_and_validation():
    hard = soft_overlong_punishment(10, 0)
    assert hard(["p"] * 2, ["c"] * 2, ids_of_lengths(10, 11)) == [0.0, -1.0]
    with pytest.raises(ValueError):
        soft_overlong_punishment(10, 11)
    with pytest.raises(ValueError):
        soft_overlong_punishment(0, 0)
    with pytest.raises(ValueError, match="completion_ids"):
        hard(["p"], ["c"], None)


def fake_accuracy(values):
    def accuracy(prompts, completions, completion_ids, **kwargs):
        return list(values)

    return accuracy


def test_cosine_scaled_hand_values():
    # max_len 100: p = L / 100, c = cos(pi p); correct in [0.5, 1], wrong in [-1, -0.5]
    reward = cosine_scaled_reward(
        max_len=100, accuracy=fake_accuracy([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, None])
    )
    got = reward(["p"] * 8, ["c"] * 8, ids_of_lengths(0, 50, 100, 0, 50, 100, 200, 10))
    expected = [
        1.0,  # correct, L=0: c=1 -> 0.5 + 0.5 * 1 * 2 / 2
        0.75,  # correct, L=50: c=0 -> 0.5 + 0.5 * 0.5
        0.5,  # correct, L=100: c=-1 -> 0.5
        -1.0,  # wrong, L=0: short and wrong is punished most
        -0.75,
        -0.5,  # wrong at max_len: least punished
        0.5,  # L past max_len is capped at p=1
        None,  # ungradable stays None
    ]
    assert got[:7] == pytest.approx(expected[:7])
    assert got[7] is None


def test_cosine_scaled_custom_values_at_quarter_length():
    reward = cosine_scaled_reward(
        max_len=4, min_value_correct=0.0, max_value_correct=2.0, accuracy=fake_accuracy([1.0])
    )
    # L=1: p=0.25, c=cos(pi/4)=0.70711 -> 0 + 2 * (1 + 0.70711) / 2
    assert reward(["p"], ["c"], [[1]]) == pytest.approx([1.0 + math.cos(math.pi / 4)])


def test_cosine_scaled_uses_accuracy_by_default(verifier):
    from grpokit.rewards import make_accuracy_reward

    accuracy = make_accuracy_reward(verifier=verifier)
    reward = cosine_scaled_reward(max_len=10, accuracy=accuracy)
    got = reward(["p"] * 2, [r"\boxed{4}", r"\boxed{5}"], ids_of_lengths(0, 0), solution=["4", "4"])
    assert got == pytest.approx([1.0, -1.0])


def test_repetition_penalty_hand_values():
    reward = repetition_penalty_reward(ngram_size=3, max_penalty=-1.0)
    ids = [
        [1, 2, 3, 4, 5],  # 3 trigrams, all distinct -> 0
        [1, 2, 3, 1, 2, 3],  # 4 trigrams, 3 distinct -> -(1 - 3/4) = -0.25
        [7] * 10,  # 8 trigrams, 1 distinct -> -(1 - 1/8) = -0.875
        [1, 2],  # fewer than 3 tokens -> 0
        [],
    ]
    assert reward(["p"] * 5, ["c"] * 5, ids) == pytest.approx([0.0, -0.25, -0.875, 0.0, 0.0])
    half = repetition_penalty_reward(ngram_size=1, max_penalty=-0.5)
    # unigrams of [1, 1, 2, 2]: 4 total, 2 distinct -> -0.5 * 0.5
    assert half(["p"], [[{"role": "assistant", "content": "c"}]], [[1, 1, 2, 2]]) == pytest.approx([-0.25])


def test_repetition_penalty_validation():
    with pytest.raises(ValueError):
        repetition_penalty_reward(ngram_size=0)
    with pytest.raises(ValueError):
        repetition_penalty_reward(max_penalty=0.5)
