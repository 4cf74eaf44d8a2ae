"""Adaptive entropy control (Skywork-OR1, arXiv:2505.22312; TRL's ``use_adaptive_entropy``): the entropy
bonus coefficient follows the policy's entropy, one step per optimizer step. Plain floats, no state: the
trainer keeps the coefficient and the last entropy (``grpokit.train.entropy_control``)."""

from __future__ import annotations

import math

__all__ = ["adapted_entropy_coef", "applied_entropy_coef"]


def adapted_entropy_coef(
    coef: float, entropy: float, *, target: float, delta: float, coef_min: float, coef_max: float
) -> float:
    """The coefficient after an optimizer step whose mean token entropy was ``entropy``:

    coef' = min(coef + delta, coef_max)   if entropy <= target   (entropy too low: push it up)
            max(coef - delta, coef_min)   otherwise
    """
    if entropy <= target:
        return min(coef + delta, coef_max)
    return max(coef - delta, coef_min)


def applied_entropy_coef(coef: float, last_entropy: float, target: float) -> float:
    """The coefficient a step applies: ``coef`` when the previous step's entropy was at or below ``target``,
    else 0 (the bonus only acts against collapse). ``last_entropy`` = inf before any step: no bonus."""
    return coef if not math.isnan(last_entropy) and last_entropy <= target else 0.0
