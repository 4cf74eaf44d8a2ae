"""Per-token estimators of KL(pi_theta || pi_ref) from tokens sampled from pi_theta (Schulman, "Approximating
KL divergence", 2020). GRPO (arXiv:2402.03300, eq. 4) uses k3 and adds it to the loss, not to the reward."""

from __future__ import annotations

import torch
from torch import Tensor

KL_ESTIMATORS = ("k1", "k2", "k3")

# exp(20) ~ 4.9e8: far outside any useful ratio, still finite in float32 (and its square too).
LOG_RATIO_CLAMP = 20.0


def kl_penalty(logps: Tensor, ref_logps: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token KL estimate, same shape as ``logps`` (e.g. [N, T]), float32.

    With d = ref_logps - logps = log(pi_ref / pi_theta):
        k1 = -d                      = logps - ref_logps           (unbiased, can be negative)
        k2 = d^2 / 2                                               (biased, >= 0)
        k3 = exp(d) - d - 1                                        (unbiased, >= 0; the GRPO paper's choice)
    For k3, d is clamped to [-20, 20] so exp(d) stays finite, and k3 is computed as expm1(d) - d clamped at 0:
    exp(d) - d - 1 in float32 rounds to small negative values for |d| ~ 1e-8.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")
    if logps.shape != ref_logps.shape:
        raise ValueError(f"ref_logps shape {tuple(ref_logps.shape)} != logps shape {tuple(logps.shape)}")
    d = ref_logps.to(torch.float32) - logps.to(torch.float32)  # log(pi_ref / pi_theta)
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d.pow(2)
    d = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.expm1(d) - d).clamp(min=0.0)
