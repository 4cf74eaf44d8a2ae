"""Per-token weights of the policy term (``PolicyLoss(token_weights=...)``): the off-policy correction for a
sampler that is not pi_old (TRL's ``vllm_importance_sampling_*``), the high-entropy token mask, and the
off-policy sequence mask."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .choices import IS_MODES

__all__ = [
    "IS_MODES",
    "entropy_threshold",
    "importance_sampling_ratio",
    "importance_sampling_weights",
    "off_policy_sequence_mask",
    "top_entropy_mask",
]


def check_shape(name: str, x: Tensor | None, shape: torch.Size) -> None:
    """``x`` (if given) has ``shape``, else a ValueError naming it."""
    if x is not None and x.shape != shape:
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")


def _check_is_bounds(mode: str, clip_min: float | None, clip_max: float | None) -> None:
    if mode not in IS_MODES:
        raise ValueError(f"mode must be one of {IS_MODES}, got {mode!r}")
    for name, bound in (("clip_min", clip_min), ("clip_max", clip_max)):
        if bound is not None and not bound > 0:
            raise ValueError(f"{name} must be > 0 (a bound on a ratio of probabilities) or None, got {bound}")
    if clip_min is not None and clip_max is not None and clip_min >= clip_max:
        raise ValueError(f"clip_min ({clip_min}) must be < clip_max ({clip_max})")
    if mode.endswith("_truncate") and clip_min is None and clip_max is None:
        raise ValueError(f"mode {mode!r} needs clip_min or clip_max (a truncation without bounds is a no-op)")


def importance_sampling_ratio(
    old_logps: Tensor,
    sampling_logps: Tensor,
    mask: Tensor,
    *,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> Tensor:
    """The off-policy correction ratio for a sampler that differs from the trainer's pi_old (a bf16 copy,
    vLLM, an outside backend), detached, truncated or masked: [N, T] for token modes, [N, 1] for sequence
    modes (TRL's ``vllm_importance_sampling_ratio``).

    old_logps, sampling_logps, mask: [N, T]. With d_it = old_logps_it - sampling_logps_it on masked tokens (0
    on padding, and 0 where the sampler's log-prob is NaN, i.e. unknown: ratio 1 there, as in TRL):
        token_*:    rho_it = exp(d_it)                      [N, T]
        sequence_*: rho_i  = exp(sum_{t in o_i} d_it)       [N, 1]
        *_truncate: w = clamp(rho, clip_min, clip_max)      (TIS; a None bound does not bind)
        *_mask:     w = rho if clip_min <= rho <= clip_max else 0   (MIS; None: no bound)
    Padded positions of the token modes hold the (meaningless) ratio of d = 0; see
    :func:`importance_sampling_weights` for the [N, T] weights with padding zeroed.
    """
    _check_is_bounds(mode, clip_min, clip_max)
    check_shape("sampling_logps", sampling_logps, old_logps.shape)
    check_shape("mask", mask, old_logps.shape)
    with torch.no_grad():
        valid = mask.to(device=old_logps.device).bool()  # [N, T]
        diff = old_logps.float() - sampling_logps.to(old_logps.device).float()  # [N, T]
        diff = torch.where(valid, torch.nan_to_num(diff, nan=0.0), 0.0)  # [N, T]
        if mode.startswith("sequence"):
            diff = diff.sum(-1, keepdim=True)  # [N, 1]
        rho = torch.exp(diff)  # [N, T] or [N, 1]
        if mode.endswith("_truncate"):
            return rho.clamp(min=clip_min, max=clip_max)
        low = -math.inf if clip_min is None else clip_min
        high = math.inf if clip_max is None else clip_max
        return torch.where((rho >= low) & (rho <= high), rho, 0.0)


def importance_sampling_weights(
    old_logps: Tensor,
    sampling_logps: Tensor,
    mask: Tensor,
    *,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> Tensor:
    """Off-policy correction weights, detached [N, T]: :func:`importance_sampling_ratio` (TRL's four
    ``vllm_importance_sampling_mode`` values, bounds [clip_min, clip_max]) on every masked token (a sequence
    ratio on all tokens of its sequence), 0 on padding. Multiply into the policy term through
    ``PolicyLoss(..., token_weights=...)`` (as TRL, the KL term is not weighted)."""
    ratio = importance_sampling_ratio(
        old_logps, sampling_logps, mask, mode=mode, clip_min=clip_min, clip_max=clip_max
    )  # [N, T] or [N, 1]
    valid = mask.to(device=ratio.device).bool()  # [N, T]
    return torch.where(valid, ratio.expand(valid.shape), 0.0)  # [N, T]


def entropy_threshold(values: Tensor, q: float) -> Tensor:
    """The q-quantile of a 1-D set of entropies (linear interpolation, as ``torch.quantile``, without its
    input-size limit): TRL's ``get_high_entropy_mask`` threshold, q = 1 - top_entropy_quantile. values: [M],
    M >= 1 (the entropies of the non-pad tokens, of every process when TRL gathers them); 0-dim result."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    if values.dim() != 1 or values.numel() == 0:
        raise ValueError(f"values must be a non-empty 1-D tensor, got shape {tuple(values.shape)}")
    ordered = values.detach().to(torch.float32).sort().values  # [M]
    pos = q * (ordered.numel() - 1)
    lo = int(pos)
    hi = min(lo + 1, ordered.numel() - 1)
    return torch.lerp(ordered[lo], ordered[hi], pos - lo)


def top_entropy_mask(
    entropy: Tensor, mask: Tensor, quantile: float, threshold: Tensor | None = None
) -> Tensor:
    """Keep the highest-entropy fraction ``quantile`` of masked tokens ("Beyond the 80/20 rule", 2506.01939).

    TRL's top_entropy_quantile: tau = Q_{1 - quantile}(entropies of masked tokens)
    (:func:`entropy_threshold`); keep = (entropy >= tau) & mask. quantile=1.0 keeps every masked token, 0.2
    the top 20%, 0.0 only the maximum (and its ties). ``threshold``: tau computed elsewhere (over every
    process's tokens, as TRL); then ``quantile`` is not read. entropy, mask: [N, T]; returns bool [N, T].
    """
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    check_shape("mask", mask, entropy.shape)
    valid = mask.bool()  # [N, T]
    ent = entropy.detach().to(torch.float32)  # [N, T]
    if threshold is None:
        if not valid.any():
            return torch.zeros_like(valid)
        threshold = entropy_threshold(ent[valid], 1.0 - quantile)
    return (ent >= threshold) & valid


def off_policy_sequence_mask(
    advantages: Tensor, logps: Tensor, sampling_logps: Tensor, mask: Tensor, threshold: float
) -> Tensor:
    """Off-policy sequence masking (DeepSeek-V3.2, arXiv:2512.02556, eq. 9; TRL's off_policy_mask_threshold):
    drop a sequence with a negative advantage whose sampler has drifted too far from pi_theta.

        KL_i = 1/|o_i| sum_{t in o_i} (log pi_sampler(o_it) - log pi_theta(o_it))     (pi_theta detached)
        M_i  = 0 if A_i < 0 and KL_i > threshold, else 1

    A token whose sampler log-prob is NaN (unknown) adds 0 to KL_i but still counts in |o_i|, as in TRL.
    advantages: [N], [N, 1] or [N, T] (per-token advantages give a per-token mask); logps, sampling_logps,
    mask: [N, T]. Returns float [N, 1] (or [N, T]), 1.0 = keep, in mask's dtype when it is floating.
    """
    check_shape("sampling_logps", sampling_logps, logps.shape)
    check_shape("mask", mask, logps.shape)
    m = mask.to(device=logps.device, dtype=torch.float32)  # [N, T]
    drift = sampling_logps.to(logps.device).float() - logps.detach().float()  # [N, T]
    drift = torch.nan_to_num(drift, nan=0.0) * m  # [N, T]; padding may hold any value
    seq_kl = drift.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)  # [N, 1]
    adv = advantages.to(logps.device)
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv  # [N, 1] or [N, T]
    keep = (adv >= 0) | (seq_kl <= threshold)  # [N, 1] or [N, T]
    return keep.to(mask.dtype if mask.is_floating_point() else torch.float32)
