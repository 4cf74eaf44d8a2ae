"""Per-token policy objectives (returned as a loss to MINIMISE) and the importance ratios they consume.

An objective maps (ratio r [N, T], advantages A [N, T], logps [N, T], ObjectiveParams) to a per-token loss
[N, T]. Adding one is one function plus one line in ``OBJECTIVES``; ``losses.policy_loss`` does the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .choices import IMPORTANCE_SAMPLING_LEVELS


@dataclass(frozen=True)
class ObjectiveParams:
    """Hyper-parameters shared by the objectives.

    epsilon_low / epsilon_high: trust region [1 - epsilon_low, 1 + epsilon_high] of the clipped objective (and
    the clip metrics); for CISPO, epsilon_high is instead the cap on the IS weight itself (TRL, ScaleRL: 5.0).
    delta: optional cap on the unclipped ratio (two-sided clipping, INTELLECT-2). sapo_temperature_pos /
    sapo_temperature_neg: SAPO gate temperatures for A > 0 / A <= 0.
    """

    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    delta: float | None = None
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05


def importance_ratio(logps: Tensor, old_logps: Tensor, mask: Tensor, level: str = "token") -> Tensor:
    """Importance ratio r [N, T] of the current policy to the one that sampled (pi_old). float32.

        token:          r_it = exp(logps_it - old_it)                                  (PPO / GRPO)
        sequence:       r_it = s_i = exp(mean_{t in o_i} (logps_it - old_it))         (GSPO, arXiv:2507.18071)
                        the gradient flows through the mean (TRL's importance_sampling_level="sequence")
        sequence_token: r_it = sg[s_i] * pi_theta(o_it) / sg[pi_theta(o_it)]          (GSPO-token)
                        same value as "sequence", gradient s_i * grad logps_it per token

    "sequence" and "sequence_token" give the same gradient when A and the token weights are constant along a
    sequence; "sequence_token" is the one for per-token advantages. Clipping acts on s_i, so per sequence.
    mask: [N, T] (1 = completion token); the mean runs over masked tokens only.
    """
    if level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(f"importance_sampling_level must be in {IMPORTANCE_SAMPLING_LEVELS}, got {level!r}")
    log_ratio = logps - old_logps  # [N, T]
    if level == "token":
        return torch.exp(log_ratio)
    m = mask.to(log_ratio.dtype)
    seq_log_ratio = (log_ratio * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)  # [N, 1]
    if level == "sequence":
        return torch.exp(seq_log_ratio).expand_as(log_ratio)  # [N, T]
    return torch.exp(logps - logps.detach() + seq_log_ratio.detach())  # [N, T], value s_i


def clipped_objective(
    ratio: Tensor,
    advantages: Tensor,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    delta: float | None = None,
) -> Tensor:
    """PPO / GRPO clipped surrogate as a per-token loss [N, T] (DeepSeekMath eq. 3):

    loss = -min(r' * A, clip(r, 1 - epsilon_low, 1 + epsilon_high) * A)
    r'   = min(r, delta) if delta is given, else r
    """
    clipped = ratio.clamp(1.0 - epsilon_low, 1.0 + epsilon_high)  # [N, T]
    unclipped = ratio.clamp(max=delta) if delta is not None else ratio  # [N, T]
    return -torch.min(unclipped * advantages, clipped * advantages)


def cispo_objective(ratio: Tensor, advantages: Tensor, logps: Tensor, epsilon_high: float) -> Tensor:
    """CISPO (MiniMax-M1, arXiv:2506.13585) per-token loss [N, T]: clip the IS weight, not the update:

        loss = -sg[min(r, epsilon_high)] * A * logps

    so every token keeps a gradient sg[min(r, eps_high)] * A * grad logps. As in TRL, epsilon_high is the
    cap on r itself (ScaleRL's eps_max, recommended 5.0), not an offset from 1.
    """
    weight = ratio.clamp(max=epsilon_high).detach()  # [N, T]
    return -weight * advantages * logps


def sapo_objective(
    ratio: Tensor, advantages: Tensor, temperature_pos: float = 1.0, temperature_neg: float = 1.05
) -> Tensor:
    """SAPO (Soft Adaptive Policy Optimization, arXiv:2511.20347) per-token loss [N, T]:

        loss = -f(r) * A,   f(r) = sigmoid(tau * (r - 1)) * 4 / tau,   tau = tau_pos if A > 0 else tau_neg

    f(1) = 2/tau and f'(1) = 1, so on-policy the gradient is the plain policy gradient; off-policy the smooth
    gate fades it instead of cutting it at a hard clip boundary.
    """
    tau = torch.where(
        advantages > 0,
        torch.as_tensor(temperature_pos, dtype=ratio.dtype, device=ratio.device),
        torch.as_tensor(temperature_neg, dtype=ratio.dtype, device=ratio.device),
    )  # [N, T]
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau  # [N, T]
    return -gate * advantages


ObjectiveFn = Callable[[Tensor, Tensor, Tensor, ObjectiveParams], Tensor]

OBJECTIVES: dict[str, ObjectiveFn] = {
    "clipped": lambda r, a, lp, p: clipped_objective(r, a, p.epsilon_low, p.epsilon_high, p.delta),
    "cispo": lambda r, a, lp, p: cispo_objective(r, a, lp, p.epsilon_high),
    "sapo": lambda r, a, lp, p: sapo_objective(r, a, p.sapo_temperature_pos, p.sapo_temperature_neg),
}
"""objective name -> fn(ratio [N, T], advantages [N, T], logps [N, T], params) -> per-token loss [N, T]."""
