"""The GRPO policy loss (:class:`PolicyLoss`, functional form :func:`policy_loss`) and its helpers:
presets, off-policy correction weights, the entropy mask.

``loss_type`` is a preset over two orthogonal choices: the per-token objective
(``objectives.OBJECTIVES``) and the aggregation (``aggregation.AGGREGATIONS``). Hyperparameters are
validated once, when a :class:`PolicyLoss` is built; GRPOConfig validates its loss fields by building one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from .aggregation import AGGREGATION_IS_GLOBAL, AGGREGATIONS
from .kl import KL_ESTIMATORS, kl_penalty
from .objectives import IMPORTANCE_SAMPLING_LEVELS, OBJECTIVES, ObjectiveParams, importance_ratio

__all__ = [
    "IS_MODES",
    "LOSS_PRESETS",
    "LossConfigError",
    "PolicyLoss",
    "importance_sampling_ratio",
    "importance_sampling_weights",
    "policy_loss",
    "top_entropy_mask",
]

LOSS_PRESETS: dict[str, tuple[str, str]] = {
    "grpo": ("clipped", "grpo"),
    "bnpo": ("clipped", "bnpo"),
    "dr_grpo": ("clipped", "dr_grpo"),
    "dapo": ("clipped", "dapo"),
    "cispo": ("cispo", "dapo"),  # TRL: CISPO normalises by the global token count, like dapo
    "sapo": ("sapo", "grpo"),  # TRL: SAPO aggregates like grpo
}
"""loss_type -> (objective name in OBJECTIVES, aggregation name in AGGREGATIONS)."""


def _check_like(name: str, x: Tensor | None, shape: torch.Size) -> None:
    if x is not None and x.shape != shape:
        raise ValueError(f"{name} must have the shape of logps {tuple(shape)}, got {tuple(x.shape)}")


def _validate(
    logps: Tensor,
    old_logps: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    ref_logps: Tensor | None,
    token_weights: Tensor | None,
) -> None:
    if logps.dim() != 2:
        raise ValueError(f"logps must be 2-D [N, T], got shape {tuple(logps.shape)}")
    for name, x in (("old_logps", old_logps), ("mask", mask), ("ref_logps", ref_logps)):
        _check_like(name, x, logps.shape)
    _check_like("token_weights", token_weights, logps.shape)
    if advantages.shape not in ((logps.shape[0],), logps.shape):
        raise ValueError(
            f"advantages must be [N] or [N, T] with logps {list(logps.shape)}, got {list(advantages.shape)}"
        )


class LossConfigError(ValueError):
    """An invalid loss hyperparameter; ``field`` names it (GRPOConfig reports ``GRPOConfig.<field>``)."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field} {why}")
        self.field, self.why = field, why


@dataclass(frozen=True)
class PolicyLoss:
    """The GRPO-family policy loss: hyperparameters fixed (and validated, once) at construction, tensors
    given per call. DeepSeekMath (arXiv:2402.03300) eq. 3:

        J(theta) = 1/G sum_i 1/|o_i| sum_t [ min(r_it A_it, clip(r_it, 1-eps, 1+eps) A_it) - beta D_KL_it ]

    and a call returns -J (for loss_type="grpo") with the variants one field away. ``loss_type`` is a preset
    (``LOSS_PRESETS``) over the per-token objective and the aggregation. ``PolicyLoss.from_config(config)``
    reads the fields of the same names from a GRPOConfig.
    """

    loss_type: str = "grpo"
    """grpo, bnpo, dr_grpo, dapo, cispo or sapo (see ``LOSS_PRESETS``)."""
    epsilon: float = 0.2
    """Lower clip range, in [0, 1): the ratio is clipped to [1 - epsilon, 1 + epsilon_high]."""
    epsilon_high: float | None = None
    """Upper clip range (>= epsilon; None: epsilon). For cispo: the cap on the IS weight itself (required)."""
    delta: float | None = None
    """Optional cap on the unclipped ratio (two-sided clipping); must exceed 1 + epsilon_high."""
    importance_sampling_level: str = "token"
    """token, sequence (GSPO) or sequence_token (GSPO-token)."""
    beta: float = 0.0
    """KL coefficient (>= 0); > 0 needs ref_logps at each call."""
    max_completion_length: int | None = None
    """The constant normaliser of dr_grpo (required there)."""
    kl_estimator: str = "k3"
    """k1, k2 or k3 (Schulman); the paper uses k3."""
    sapo_temperature_pos: float = 1.0
    """SAPO gate temperature for A > 0."""
    sapo_temperature_neg: float = 1.05
    """SAPO gate temperature for A <= 0."""
    use_bias_correction_kl: bool = False
    """Multiply the per-token KL by the importance ratio r = pi_theta / pi_old (TRL's name; its default is
    True): the KL estimate is then taken under pi_theta's distribution rather than the sampler's. The ratio
    keeps its gradient, so even on-policy (r = 1) the KL term adds KL * grad log pi_theta."""

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_PRESETS:
            raise LossConfigError(
                "loss_type", f"must be one of {tuple(LOSS_PRESETS)}, got {self.loss_type!r}"
            )
        if self.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
            raise LossConfigError(
                "importance_sampling_level",
                f"must be one of {IMPORTANCE_SAMPLING_LEVELS}, got {self.importance_sampling_level!r}",
            )
        if not 0 <= self.epsilon < 1:
            raise LossConfigError("epsilon", f"must be in [0, 1), got {self.epsilon}")
        if self.objective == "cispo":
            if self.epsilon_high is None or self.epsilon_high <= 0:
                raise LossConfigError(
                    "epsilon_high",
                    f"must be > 0 with loss_type='cispo': it is the IS-weight cap (e.g. 5.0), got "
                    f"{self.epsilon_high}",
                )
        elif self.clip_high < self.epsilon:
            raise LossConfigError("epsilon_high", f"({self.clip_high}) must be >= epsilon ({self.epsilon})")
        if self.delta is not None and self.delta <= 1 + self.clip_high:
            raise LossConfigError(
                "delta", f"must exceed 1 + epsilon_high = {1 + self.clip_high}, got {self.delta}"
            )
        if self.beta < 0:
            raise LossConfigError("beta", f"must be >= 0, got {self.beta}")
        if self.aggregation == "dr_grpo" and (self.max_completion_length or 0) <= 0:
            raise LossConfigError(
                "max_completion_length",
                f"must be > 0 for {self.loss_type!r}, got {self.max_completion_length}",
            )
        if self.kl_estimator not in KL_ESTIMATORS:
            raise LossConfigError(
                "kl_estimator", f"must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}"
            )
        for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
            if getattr(self, name) <= 0:
                raise LossConfigError(name, f"must be > 0, got {getattr(self, name)}")

    @classmethod
    def from_config(cls, config: Any) -> PolicyLoss:
        """The loss of a GRPOConfig (any object with these field names)."""
        return cls(
            **{item.name: getattr(config, item.name) for item in fields(cls) if hasattr(config, item.name)}
        )

    @property
    def objective(self) -> str:
        """The per-token objective's name in ``OBJECTIVES``."""
        return LOSS_PRESETS[self.loss_type][0]

    @property
    def aggregation(self) -> str:
        """The aggregation's name in ``AGGREGATIONS``."""
        return LOSS_PRESETS[self.loss_type][1]

    @property
    def clip_high(self) -> float:
        """The upper clip range in use: epsilon_high, or epsilon when that is None."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @property
    def is_global(self) -> bool:
        """True when the aggregation normalises by the whole optimizer step (dapo, cispo): the trainer passes
        ``num_items_in_batch`` and does not divide by its number of micro-batches."""
        return AGGREGATION_IS_GLOBAL[self.aggregation]

    def __call__(
        self,
        logps: Tensor,
        old_logps: Tensor | None,
        advantages: Tensor,
        mask: Tensor,
        *,
        ref_logps: Tensor | None = None,
        num_items_in_batch: int | float | Tensor | None = None,
        token_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss to MINIMISE and its metrics.

        logps, old_logps, ref_logps, mask, token_weights: [N, T]; advantages: [N] (broadcast over tokens) or
        [N, T] (process supervision). old_logps=None means on-policy: pi_old = sg[pi_theta], so r = 1 and the
        gradient is the plain advantage-weighted policy gradient. Per token (only where mask is set):

            l_it = objective(r_it, A_it) * w_it + beta * KL_it        (w = token_weights, 1 if None)
                   (with use_bias_correction_kl: beta * KL_it * r_it)
            loss = aggregation(l, mask)                              (preset of ``loss_type``)

        As in TRL, token_weights (entropy mask, off-policy IS weights) scale the policy term only, not the KL.
        ``num_items_in_batch``: completion tokens of the whole optimizer step (dapo, cispo). Padded positions
        may hold any value (even NaN): they are never read.

        Metrics (detached 0-dim float32, means over masked tokens): "ratio_mean", "clip_ratio/low_mean" (A < 0
        and r < 1-eps), "clip_ratio/high_mean" (A > 0 and r > 1+eps_high; for cispo: r > epsilon_high, the cap
        is active), "clip_ratio/region_mean" (either), and "kl" when ref_logps is given.
        """
        _validate(logps, old_logps, advantages, mask, ref_logps, token_weights)
        if self.beta > 0 and ref_logps is None:
            raise ValueError("ref_logps is required when beta > 0")
        valid = mask.to(device=logps.device).bool()  # [N, T]
        m = valid.to(torch.float32)  # [N, T]

        def clean(x: Tensor) -> Tensor:  # float32, zero (and gradient-free) at padded positions
            return torch.where(valid, x.to(device=logps.device, dtype=torch.float32), 0.0)

        lp = clean(logps)  # [N, T]
        old = lp.detach() if old_logps is None else clean(old_logps).detach()  # [N, T]
        adv = advantages.to(device=logps.device, dtype=torch.float32)
        adv = clean(adv.unsqueeze(-1).expand_as(lp) if adv.dim() == 1 else adv)  # [N, T]

        ratio = importance_ratio(lp, old, m, self.importance_sampling_level)  # [N, T]
        params = ObjectiveParams(
            self.epsilon, self.clip_high, self.delta, self.sapo_temperature_pos, self.sapo_temperature_neg
        )
        per_token = OBJECTIVES[self.objective](ratio, adv, lp, params)  # [N, T]
        if token_weights is not None:
            per_token = per_token * clean(token_weights)
        kl = None
        if ref_logps is not None:  # [N, T]; with beta = 0 it is only a metric, so no graph
            kl = kl_penalty(
                lp if self.beta > 0 else lp.detach(), clean(ref_logps).detach(), self.kl_estimator
            )
        if self.beta > 0 and kl is not None:
            per_token = per_token + self.beta * (kl * ratio if self.use_bias_correction_kl else kl)
        loss = AGGREGATIONS[self.aggregation](per_token, m, self.max_completion_length, num_items_in_batch)
        cispo = self.objective == "cispo"
        metrics = _loss_metrics(ratio, adv, m, kl, cispo=cispo, low=self.epsilon, high=self.clip_high)
        return loss, metrics


@torch.no_grad()
def _loss_metrics(
    ratio: Tensor, adv: Tensor, m: Tensor, kl: Tensor | None, *, cispo: bool, low: float, high: float
) -> dict[str, Tensor]:
    """Means over masked tokens (m [N, T]) of the ratio, the clip indicators and the KL; detached float32."""
    count = m.sum().clamp(min=1.0)

    def token_mean(x: Tensor) -> Tensor:
        return (x.to(torch.float32) * m).sum() / count

    r = ratio.detach()  # [N, T]
    if cispo:  # the cap min(r, high) is active, whatever the sign of A; there is no lower bound
        is_low, is_high = torch.zeros_like(r, dtype=torch.bool), r > high
    else:
        is_low, is_high = (r < 1.0 - low) & (adv < 0), (r > 1.0 + high) & (adv > 0)
    metrics = {
        "ratio_mean": token_mean(r),
        "clip_ratio/low_mean": token_mean(is_low),
        "clip_ratio/high_mean": token_mean(is_high),
        "clip_ratio/region_mean": token_mean(is_low | is_high),
    }
    if kl is not None:
        metrics["kl"] = token_mean(kl.detach())
    return metrics


def policy_loss(
    logps: Tensor,
    old_logps: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_type: str = "grpo",
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    delta: float | None = None,
    importance_sampling_level: str = "token",
    beta: float = 0.0,
    ref_logps: Tensor | None = None,
    max_completion_length: int | None = None,
    num_items_in_batch: int | float | Tensor | None = None,
    token_weights: Tensor | None = None,
    kl_estimator: str = "k3",
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The functional form of :class:`PolicyLoss`: ``PolicyLoss(hyperparameters)(tensors)``.

    Returns the GRPO-family loss to MINIMISE and its metrics; see :class:`PolicyLoss` for every argument.
    """
    loss = PolicyLoss(
        loss_type=loss_type,
        epsilon=epsilon,
        epsilon_high=epsilon_high,
        delta=delta,
        importance_sampling_level=importance_sampling_level,
        beta=beta,
        max_completion_length=max_completion_length,
        kl_estimator=kl_estimator,
        sapo_temperature_pos=sapo_temperature_pos,
        sapo_temperature_neg=sapo_temperature_neg,
    )
    return loss(
        logps,
        old_logps,
        advantages,
        mask,
        ref_logps=ref_logps,
        num_items_in_batch=num_items_in_batch,
        token_weights=token_weights,
    )


IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
"""TRL's ``vllm_importance_sampling_mode`` values: granularity (token / sequence) x constraint (truncate /
mask)."""


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
    _check_like("sampling_logps", sampling_logps, old_logps.shape)
    _check_like("mask", mask, old_logps.shape)
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
    _check_like("mask", mask, entropy.shape)
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
