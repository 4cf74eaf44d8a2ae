"""Per-token weights of the policy term (``PolicyLoss(token_weights=...)``): the off-policy correction for a
sampler that is not pi_old (TRL's ``vllm_importance_sampling_*``), and the high-entropy token mask."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .choices import IS_MODES

__all__ = ["IS_MODES", "importance_sampling_ratio", "importance_sampling_weights", "top_entropy_mask"]


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


def top_entropy_mask(entropy: Tensor, mask: Tensor, quantile: float) -> Tensor:
    """Keep the highest-entropy fraction ``quantile`` of masked tokens ("Beyond the 80/20 rule", 2506.01939).

    TRL's top_entropy_quantile: tau = Q_{1 - quantile}(entropies of masked tokens), linear interpolation as
    torch.quantile; keep = (entropy >= tau) & mask. quantile=1.0 keeps every masked token, 0.2 the top 20%,
    0.0 only the maximum (and its ties). entropy, mask: [N, T]; returns bool [N, T].
    """
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    check_shape("mask", mask, entropy.shape)
    valid = mask.bool()  # [N, T]
    ent = entropy.detach().to(torch.float32)  # [N, T]
    values = ent[valid].sort().values  # [M]
    if values.numel() == 0:
        return torch.zeros_like(valid)
    # Same interpolation as torch.quantile, without its input-size limit.
    pos = (1.0 - quantile) * (values.numel() - 1)
    lo = int(pos)
    hi = min(lo + 1, values.numel() - 1)
    threshold = torch.lerp(values[lo], values[hi], pos - lo)
    return (ent >= threshold) & valid
