"""Length shaping: DAPO soft overlong punishment, cosine-scaled correctness, n-gram repetition penalty.

Lengths are token counts, ``L_i = len(completion_ids[i])``, so the shaping matches ``max_completion_length``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from grpokit.data.chat import completion_texts
from grpokit.rewards.base import RewardFunc


def _lengths(completion_ids: Sequence[Sequence[int]] | None, n: int, name: str) -> list[int]:
    if completion_ids is None or len(completion_ids) != n:
        got = "None" if completion_ids is None else f"{len(completion_ids)} lists"
        raise ValueError(
            f"{name} measures length in tokens: needs completion_ids for {n} completions, got {got}"
        )
    return [len(ids) for ids in completion_ids]


def soft_overlong_punishment(max_completion_len: int, soft_punish_cache: int) -> RewardFunc:
    """DAPO's soft overlong punishment (arXiv:2503.14476, eq. 13), with M = max_completion_len, C = cache:

        r(L) = 0                 if L <= M - C
               (M - C - L) / C   if M - C < L <= M      (linear from 0 down to -1)
               -1                if L > M

    ``soft_punish_cache = 0`` gives a hard cut: 0 up to M, -1 beyond. Added to the task reward (weight 1).
    """
    if max_completion_len <= 0:
        raise ValueError(f"max_completion_len must be > 0, got {max_completion_len}")
    if not 0 <= soft_punish_cache <= max_completion_len:
        raise ValueError(f"soft_punish_cache must be in [0, {max_completion_len}], got {soft_punish_cache}")
    start = max_completion_len - soft_punish_cache

    def punish(length: int) -> float:
        if length <= start:
            return 0.0
        if length <= max_completion_len:
            return (start - length) / soft_punish_cache
        return -1.0

    def soft_overlong_punishment_reward(
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        lengths = _lengths(completion_ids, len(completions), "soft_overlong_punishment")
        return [punish(length) for length in lengths]

    soft_overlong_punishment_reward.__name__ = "soft_overlong_punishment"
    soft_overlong_punishment_reward.__qualname__ = "soft_overlong_punishment"
    return soft_overlong_punishment_reward


def cosine_scaled_reward(
    max_len: int = 1000,
    *,
    min_value_wrong: float = -1.0,
    max_value_wrong: float = -0.5,
    min_value_correct: float = 0.5,
    max_value_correct: float = 1.0,
    accuracy: RewardFunc | None = None,
) -> RewardFunc:
    """Correctness reward scaled by length on a cosine schedule (Yeo et al. arXiv:2502.03373; open-r1).

    With progress p = min(L / max_len, 1) and c = cos(pi * p):

        correct: r = min_value_correct + (max_value_correct - min_value_correct) * (1 + c) / 2
                 (short and right earns max_value_correct, right at max_len earns min_value_correct)
        wrong:   r = max_value_wrong + (min_value_wrong - max_value_wrong) * (1 + c) / 2
                 (short and wrong is punished most, min_value_wrong; long and wrong least, max_value_wrong)

    Correctness comes from ``accuracy`` (default :data:`grpokit.rewards.accuracy_reward`, so the dataset needs
    a ``solution`` column); when it says None (ungradable), so does this. Differences from open-r1: length is
    in tokens, not characters, and p is capped at 1 (open-r1's cosine rises again past max_len).
    """
    if max_len <= 0:
        raise ValueError(f"max_len must be > 0, got {max_len}")

    def scaled(length: int, correct: float) -> float:
        cosine = math.cos(math.pi * min(length / max_len, 1.0))
        if correct >= 0.5:
            low, high = min_value_correct, max_value_correct
        else:
            low, high = max_value_wrong, min_value_wrong
        return low + (high - low) * 0.5 * (1.0 + cosine)

    def cosine_scaled(
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        lengths = _lengths(completion_ids, len(completions), "cosine_scaled_reward")
        if accuracy is None:
            from grpokit.rewards.accuracy import accuracy_reward as check
        else:
            check = accuracy
        correct = check(prompts, completions, completion_ids, **kwargs)
        return [None if ok is None else scaled(length, ok) for length, ok in zip(lengths, correct)]

    cosine_scaled.__name__ = cosine_scaled.__qualname__ = "cosine_scaled_reward"
    return cosine_scaled


def repetition_penalty_reward(ngram_size: int = 3, max_penalty: float = -1.0) -> RewardFunc:
    """Penalty for repeated token n-grams (open-r1's ``repetition_penalty_reward``, over token ids):

        r = max_penalty * (1 - |distinct n-grams| / |n-grams|)      (0 when there are fewer than n tokens)

    So a completion of distinct n-grams scores 0 and one token repeated forever approaches ``max_penalty``.
    """
    if ngram_size < 1:
        raise ValueError(f"ngram_size must be >= 1, got {ngram_size}")
    if max_penalty > 0:
        raise ValueError(f"max_penalty must be <= 0 (it is a penalty), got {max_penalty}")

    def penalty(ids: Sequence[int]) -> float:
        tokens = list(ids)
        total = len(tokens) - ngram_size + 1
        if total <= 0:
            return 0.0
        distinct = {tuple(tokens[i : i + ngram_size]) for i in range(total)}
        return max_penalty * (1.0 - len(distinct) / total)

    def repetition_penalty(
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        _lengths(completion_ids, len(completions), "repetition_penalty_reward")
        completion_texts(completions)  # type check: strings or messages, like every reward
        return [penalty(ids) for ids in completion_ids or ()]

    repetition_penalty.__name__ = repetition_penalty.__qualname__ = "repetition_penalty_reward"
    return repetition_penalty
