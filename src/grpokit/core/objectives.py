"""Per-token policy objectives (returned as a loss to MINIMISE) and the importance ratios they consume.

An objective maps the per-token terms (:class:`TokenTerms`: ratio, advantages, log-probs, ...) and its
hyperparameters (:class:`ObjectiveParams`) to a per-token loss [N, T]. Adding one is one function plus one
line in ``OBJECTIVES``; ``losses.policy_loss`` does the rest.
"""

from __future__ import annotations

import math
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
    sapo_temperature_neg: SAPO gate temperatures for A > 0 / A <= 0. vespo_k_pos, vespo_lambda_pos /
    vespo_k_neg, vespo_lambda_neg: VESPO's gamma weight for A >= 0 / A < 0.
    """

    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    delta: float | None = None
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0


@dataclass(frozen=True)
class TokenTerms:
    """What an objective reads, all [N, T] float32 and zero on padding.

    ratio: the importance ratio at the configured level (:func:`importance_ratio`); advantages; logps (with
    their gradient) and old_logps (detached, log pi_old); mask (1.0 = completion token); sampler_weights: the
    off-policy correction pi_old / pi_sampler of each token (``token_weights.importance_sampling_weights``),
    or None when the sampler is pi_old.
    """

    ratio: Tensor
    advantages: Tensor
    logps: Tensor
    old_logps: Tensor
    mask: Tensor
    sampler_weights: Tensor | None = None


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


LOG_W_MIN = math.log(1e-8)
"""VESPO's lower clamp of a log importance weight (TRL's, from the reference implementation)."""


@torch.no_grad()
def vespo_gamma_weights(
    advantages: Tensor,
    log_ratio: Tensor,
    mask: Tensor,
    sampler_weights: Tensor | None = None,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
) -> Tensor:
    """VESPO's gamma weight phi(w) of each sequence, detached [N, 1] (arXiv:2602.10693; TRL's
    ``get_gamma_weights``):

        log w_i  = clamp(sum_{t in o_i} clamp(log r_it, -20, 20)
                         + sum_{t in o_i} clamp(log c_it, log 1e-8, 20),  log 1e-8, 20)
        phi(w_i) = exp(lambda + k log w_i - lambda w_i) = e^lambda w^k e^(-lambda w),  phi(1) = 1
        (k, lambda) = (k_pos, lambda_pos) if A_i >= 0 else (k_neg, lambda_neg);  lambda clamped to >= 1e-4

    r = pi_theta / pi_old per token; c = pi_old / pi_sampler (``sampler_weights``, a token-level off-policy
    correction; a masked-out token's 0 clamps to 1e-8). A non-finite phi becomes 0. advantages: [N] or [N, 1]
    (result [N, 1]), or [N, T] (per-token signs, as TRL: result [N, T]); log_ratio, mask, sampler_weights:
    [N, T]; padding may hold any value.
    """
    m = mask.to(torch.float32)  # [N, T]
    seq_log_w = (log_ratio.float().clamp(-20.0, 20.0) * m).sum(-1, keepdim=True)  # [N, 1]
    if sampler_weights is not None:
        log_c = torch.log(sampler_weights.float()).clamp(LOG_W_MIN, 20.0)  # [N, T]
        seq_log_w = seq_log_w + (log_c * m).sum(-1, keepdim=True)  # padding: no correction
    log_w = seq_log_w.clamp(LOG_W_MIN, 20.0)  # [N, 1]
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # [N, 1] or [N, T]
    nonneg = adv >= 0
    k = torch.where(nonneg, k_pos, k_neg).to(torch.float32)  # [N, 1] or [N, T]
    lam = torch.where(nonneg, lambda_pos, lambda_neg).to(torch.float32).clamp(min=1e-4)
    log_phi = lam + k * log_w - lam * torch.exp(log_w)  # [N, 1] or [N, T]
    return torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo_objective(terms: TokenTerms, params: ObjectiveParams) -> Tensor:
    """VESPO (Variational Sequence-Level Soft Policy Optimization, arXiv:2602.10693) per-token loss [N, T]:

        loss = -sg[phi(w_i)] * A_it * logps_it

    phi the gamma weight of the sequence's importance weight w_i = prod_t r_it (times the sampler
    correction) (:func:`vespo_gamma_weights`): a smooth, asymmetric down-weighting of off-policy sequences
    instead of a hard clip. On-policy w = 1 and phi = 1: the plain policy gradient. The ratio always comes
    from per-token log-ratios, whatever ``importance_sampling_level``; the sampler correction is folded into
    w, not multiplied.
    """
    phi = vespo_phi(terms, params)  # [N, T]
    return -phi * terms.advantages * terms.logps


def vespo_phi(terms: TokenTerms, params: ObjectiveParams) -> Tensor:
    """:func:`vespo_gamma_weights` of ``terms`` with ``params``' (k, lambda): [N, T], detached."""
    log_ratio = terms.logps.detach() - terms.old_logps  # [N, T]
    return vespo_gamma_weights(
        terms.advantages, log_ratio, terms.mask, terms.sampler_weights,
        k_pos=params.vespo_k_pos, lambda_pos=params.vespo_lambda_pos,
        k_neg=params.vespo_k_neg, lambda_neg=params.vespo_lambda_neg,
    )  # fmt: skip


ObjectiveFn = Callable[[TokenTerms, ObjectiveParams], Tensor]

OBJECTIVES: dict[str, ObjectiveFn] = {
    "clipped": lambda t, p: clipped_objective(t.ratio, t.advantages, p.epsilon_low, p.epsilon_high, p.delta),
    "cispo": lambda t, p: cispo_objective(t.ratio, t.advantages, t.logps, p.epsilon_high),
    "sapo": lambda t, p: sapo_objective(
        t.ratio, t.advantages, p.sapo_temperature_pos, p.sapo_temperature_neg
    ),
    "vespo": vespo_objective,
}
"""objective name -> fn(TokenTerms, ObjectiveParams) -> per-token loss [N, T]."""

FOLDS_SAMPLER_WEIGHTS: dict[str, bool] = {"clipped": False, "cispo": False, "sapo": False, "vespo": True}
"""True where the objective takes the sampler correction into its own weight (VESPO); the others have it
multiplied into their per-token loss (TRL)."""
