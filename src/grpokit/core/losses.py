"""The GRPO policy loss (:class:`PolicyLoss`, functional form :func:`policy_loss`) and its presets. The token
weights it takes (off-policy correction, the entropy mask) are in ``core.token_weights``.

``loss_type`` is a preset over two orthogonal choices: the per-token objective
(``objectives.OBJECTIVES``) and the aggregation (``aggregation.AGGREGATIONS``). Hyperparameters are
validated once, when a :class:`PolicyLoss` is built; GRPOConfig validates its loss fields by building one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .aggregation import AGGREGATION_IS_GLOBAL, AGGREGATIONS
from .choices import IMPORTANCE_SAMPLING_LEVELS, LOSS_PRESETS
from .kl import KL_ESTIMATORS, kl_penalty
from .objectives import (
    FOLDS_SAMPLER_WEIGHTS,
    OBJECTIVES,
    ObjectiveParams,
    TokenTerms,
    importance_ratio,
    vespo_phi,
)
from .token_weights import check_shape

__all__ = ["LOSS_PRESETS", "LossConfigError", "PolicyLoss", "policy_loss"]


def _validate(
    logps: Tensor,
    old_logps: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    ref_logps: Tensor | None,
    token_weights: Tensor | None,
    sampler_weights: Tensor | None = None,
) -> None:
    if logps.dim() != 2:
        raise ValueError(f"logps must be 2-D [N, T], got shape {tuple(logps.shape)}")
    for name, x in (("old_logps", old_logps), ("mask", mask), ("ref_logps", ref_logps)):
        check_shape(name, x, logps.shape)
    check_shape("token_weights", token_weights, logps.shape)
    check_shape("sampler_weights", sampler_weights, logps.shape)
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
    (``LOSS_PRESETS``) over the per-token objective and the aggregation. The fields have GRPOConfig's names;
    ``GRPOConfig.policy_loss()`` builds the loss of a config.
    """

    loss_type: str = "grpo"
    """grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo or vespo (see ``LOSS_PRESETS``)."""
    epsilon: float = 0.2
    """Lower clip range, in [0, 1): the ratio is clipped to [1 - epsilon, 1 + epsilon_high]."""
    epsilon_high: float | None = None
    """Upper clip range (>= epsilon; None: epsilon). For cispo: the cap on the IS weight itself (ScaleRL's
    eps_max, recommended 5.0); None caps it at epsilon, as TRL does (every weight then at most 0.2)."""
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
    vespo_k_pos: float = 2.0
    """VESPO gamma-weight exponent k for A >= 0 (> 0)."""
    vespo_lambda_pos: float = 3.0
    """VESPO gamma-weight decay lambda for A >= 0 (> 0)."""
    vespo_k_neg: float = 3.0
    """VESPO gamma-weight exponent k for A < 0 (> 0)."""
    vespo_lambda_neg: float = 2.0
    """VESPO gamma-weight decay lambda for A < 0 (> 0)."""
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
            if self.clip_high <= 0:
                field = "epsilon" if self.epsilon_high is None else "epsilon_high"
                raise LossConfigError(
                    field,
                    f"must be > 0 with loss_type='cispo': epsilon_high (epsilon when it is None) is the "
                    f"IS-weight cap (e.g. 5.0), got {self.clip_high}",
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
        for name in (
            "sapo_temperature_pos", "sapo_temperature_neg",
            "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg",
        ):  # fmt: skip
            if getattr(self, name) <= 0:
                raise LossConfigError(name, f"must be > 0, got {getattr(self, name)}")

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
        """True when the aggregation normalises by the whole optimizer step (dapo, cispo, vespo): the trainer
        passes ``num_items_in_batch`` and does not divide by its number of micro-batches."""
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
        sampler_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss to MINIMISE and its metrics.

        logps, old_logps, ref_logps, mask, token_weights: [N, T]; advantages: [N] (broadcast over tokens) or
        [N, T] (process supervision). old_logps=None means on-policy: pi_old = sg[pi_theta], so r = 1 and the
        gradient is the plain advantage-weighted policy gradient. Per token (only where mask is set):

            l_it = objective(r_it, A_it) * w_it + beta * KL_it        (w = token_weights, 1 if None)
                   (with use_bias_correction_kl: beta * KL_it * r_it)
            loss = aggregation(l, mask)                              (preset of ``loss_type``)

        As in TRL, token_weights (entropy mask, off-policy sequence mask) scale the policy term only, not the
        KL.
        sampler_weights: the off-policy correction pi_old / pi_sampler ([N, T], 0 on padding): multiplied into
        the policy term like token_weights, except for vespo, which folds it into its sequence weight (TRL).
        ``num_items_in_batch``: completion tokens of the whole optimizer step (dapo, cispo). Padded positions
        may hold any value (even NaN): they are never read.

        Metrics (detached 0-dim float32, means over masked tokens): "ratio_mean", "clip_ratio/low_mean" (A < 0
        and r < 1-eps), "clip_ratio/high_mean" (A > 0 and r > 1+eps_high; for cispo: r > epsilon_high, the cap
        is active), "clip_ratio/region_mean" (either), "kl" when ref_logps is given, and for vespo
        "vespo/phi_seq_mean" (the mean gamma weight over sequences).
        """
        _validate(logps, old_logps, advantages, mask, ref_logps, token_weights, sampler_weights)
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
        params = self._objective_params()
        sampler = None if sampler_weights is None else clean(sampler_weights).detach()  # [N, T]
        terms = TokenTerms(ratio, adv, lp, old, m, sampler)
        per_token = OBJECTIVES[self.objective](terms, params)  # [N, T]
        if sampler is not None and not FOLDS_SAMPLER_WEIGHTS[self.objective]:
            per_token = per_token * sampler
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
        if self.objective == "vespo":
            phi = vespo_phi(terms, params)[:, 0]  # [N]
            metrics["vespo/phi_seq_mean"] = phi.mean() if phi.numel() else phi.sum()
        return loss, metrics

    def _objective_params(self) -> ObjectiveParams:
        return ObjectiveParams(
            epsilon_low=self.epsilon, epsilon_high=self.clip_high, delta=self.delta,
            sapo_temperature_pos=self.sapo_temperature_pos, sapo_temperature_neg=self.sapo_temperature_neg,
            vespo_k_pos=self.vespo_k_pos, vespo_lambda_pos=self.vespo_lambda_pos,
            vespo_k_neg=self.vespo_k_neg, vespo_lambda_neg=self.vespo_lambda_neg,
        )  # fmt: skip


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
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
    sampler_weights: Tensor | None = None,
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
        vespo_k_pos=vespo_k_pos,
        vespo_lambda_pos=vespo_lambda_pos,
        vespo_k_neg=vespo_k_neg,
        vespo_lambda_neg=vespo_lambda_neg,
    )
    return loss(
        logps,
        old_logps,
        advantages,
        mask,
        ref_logps=ref_logps,
        num_items_in_batch=num_items_in_batch,
        token_weights=token_weights,
        sampler_weights=sampler_weights,
    )
