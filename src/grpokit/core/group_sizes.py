"""Adaptive group sizes: spread a step's completion budget over its prompts by how uncertain their pass
rates are (``adaptive_num_generations``, docs/sampling.md).

A group's learning signal comes from the spread of its rewards: a prompt solved with probability p gives
binary rewards with standard deviation sqrt(p (1 - p)), largest at p = 0.5 and zero for a prompt that is
always or never solved. So each prompt i gets a share of the budget proportional to u_i = sqrt(p_i (1 - p_i))
(an unseen prompt counts as p = 0.5, the most uncertain), within [min_size, max_size]:

    x_i = clamp(lambda * u_i, min_size, max_size),   lambda chosen so that sum_i x_i = budget

(the proportional split with the bounds enforced by water-filling: prompts pushed to a bound keep it and the
others share what is left, still in proportion). The real-valued x_i are then rounded to integers by largest
remainder (floors first, then one more completion to the largest fractional parts, ties to the lower index),
so the sizes sum to ``budget`` exactly and stay within the bounds. Pure Python; deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["allocate_group_sizes", "pass_rate_uncertainty"]

_TOLERANCE = 1e-9
"""Real-valued shares within this below an integer count as that integer."""
_DECIMALS = 9
"""Fractional parts are compared rounded to this many decimals (equal ones tie, broken by index), so float
noise does not decide a rounding."""


def pass_rate_uncertainty(pass_rate: float | None) -> float:
    """sqrt(p (1 - p)), the standard deviation of a pass/fail reward passing with rate p; None: p = 0.5."""
    p = 0.5 if pass_rate is None else float(pass_rate)
    if not 0.0 <= p <= 1.0:  # also refuses NaN
        raise ValueError(f"pass_rates: each must be in [0, 1] or None (unseen), got {pass_rate}")
    return math.sqrt(p * (1.0 - p))


def allocate_group_sizes(
    pass_rates: Sequence[float | None], budget: int, min_size: int, max_size: int
) -> list[int]:
    """Group sizes for the prompts whose estimated pass rates are ``pass_rates`` (None: unseen).

    Each prompt's share of ``budget`` completions is proportional to sqrt(p (1 - p)) (unseen: p = 0.5),
    clamped to [min_size, max_size] (water-filling: what a clamped prompt does not take is shared by the
    others in proportion), then rounded by largest remainder, ties to the lower index. The sizes are
    integers in [min_size, max_size] summing exactly to ``budget``. Prompts that are all equally uncertain
    (every one settled at p in {0, 1} included) get sizes as equal as possible, the first ones one more.

    Raises ValueError (naming ``budget``) when no such split exists: ``budget`` smaller than
    ``min_size * len(pass_rates)`` or larger than ``max_size * len(pass_rates)``; and for bounds below 1
    or crossed, or a pass rate outside [0, 1].
    """
    if min_size < 1:
        raise ValueError(f"min_size must be >= 1, got {min_size}")
    if max_size < min_size:
        raise ValueError(f"max_size ({max_size}) must be >= min_size ({min_size})")
    weights = [pass_rate_uncertainty(p) for p in pass_rates]
    count = len(weights)
    if not min_size * count <= budget <= max_size * count:
        smaller = budget < min_size * count
        raise ValueError(
            f"budget={budget} completions cannot be split over {count} prompt(s) with group sizes in "
            f"[{min_size}, {max_size}]: "
            + (
                f"it is smaller than {count} group(s) of min_size={min_size} ({min_size * count})"
                if smaller
                else f"it is larger than {count} group(s) of max_size={max_size} ({max_size * count})"
            )
        )
    if count == 0:
        return []
    targets = _water_fill(weights, budget, min_size, max_size)
    return _round_to_budget(targets, budget, min_size, max_size)


def _water_fill(weights: list[float], budget: int, low: int, high: int) -> list[float]:
    """Real x_i = clamp(lambda * w_i, low, high) summing to ``budget`` (low * P <= budget <= high * P).

    Prompts with w_i = 0 sit at ``low`` unless the others, all at ``high``, still leave budget over: then
    they share it equally. All-equal weights (all zero included) give the equal split.
    """
    count = len(weights)
    if all(w == weights[0] for w in weights):
        return [budget / count] * count
    positive = [i for i, w in enumerate(weights) if w > 0]
    zeros = [i for i, w in enumerate(weights) if w == 0]
    x = [float(low)] * count
    # the most the uncertain prompts can take, the settled ones staying at the minimum
    if high * len(positive) + low * len(zeros) < budget:  # so zeros is not empty: budget <= high * P
        for i in positive:
            x[i] = float(high)
        rest = (budget - high * len(positive)) / len(zeros)
        for i in zeros:
            x[i] = rest
        return x
    target = budget - low * len(zeros)  # shared by the positive-weight prompts
    w = [weights[i] for i in positive]

    def total(lam: float) -> float:
        return sum(min(max(lam * wi, low), high) for wi in w)

    # total() is continuous, non-decreasing and linear between the breakpoints low/w_i and high/w_i
    points = sorted({low / wi for wi in w} | {high / wi for wi in w})
    left, right = 0, len(points) - 1  # the first breakpoint where total() reaches the target
    while left < right:
        middle = (left + right) // 2
        if total(points[middle]) >= target:
            right = middle
        else:
            left = middle + 1
    hi_point = points[left]
    lo_point = points[left - 1] if left > 0 else 0.0
    f_lo, f_hi = total(lo_point), total(hi_point)
    lam = hi_point if f_hi <= f_lo else lo_point + (target - f_lo) * (hi_point - lo_point) / (f_hi - f_lo)
    for i, wi in zip(positive, w):
        x[i] = min(max(lam * wi, low), high)
    return x


def _round_to_budget(targets: list[float], budget: int, low: int, high: int) -> list[int]:
    """Largest-remainder rounding of ``targets`` (within [low, high], summing to ``budget`` up to float
    noise) to integers in [low, high] summing exactly to ``budget``; ties go to the lower index."""
    sizes = [min(max(math.floor(t + _TOLERANCE), low), high) for t in targets]
    fractions = [max(t - s, 0.0) for t, s in zip(targets, sizes)]

    def largest_first(i: int) -> tuple[float, int]:
        return (-round(fractions[i], _DECIMALS), i)

    missing = budget - sum(sizes)
    for i in sorted(range(len(sizes)), key=largest_first):
        if missing <= 0:
            break
        if sizes[i] < high:
            sizes[i] += 1
            missing -= 1
    # repair float drift (a no-op in exact arithmetic): most under target first when short, most over when
    # long, within the bounds, ties to the lower index
    while missing > 0:
        i = min((i for i in range(len(sizes)) if sizes[i] < high), key=lambda i: (sizes[i] - targets[i], i))
        sizes[i] += 1
        missing -= 1
    while missing < 0:
        i = min((i for i in range(len(sizes)) if sizes[i] > low), key=lambda i: (targets[i] - sizes[i], i))
        sizes[i] -= 1
        missing += 1
    return sizes
