"""The names core's functions accept, one home each: the loss presets, importance-sampling levels and
modes, reward scalings and multi-reward aggregations.

Plain strings, no torch: ``GRPOConfig`` makes its field types from these tuples (``grpokit.config.choices``)
without importing the math, so ``import grpokit`` stays light.
"""

from __future__ import annotations

__all__ = ["IMPORTANCE_SAMPLING_LEVELS", "IS_MODES", "LOSS_PRESETS", "MULTI_REWARD_AGGREGATIONS", "SCALES"]

LOSS_PRESETS: dict[str, tuple[str, str]] = {
    "grpo": ("clipped", "grpo"),
    "bnpo": ("clipped", "bnpo"),
    "dr_grpo": ("clipped", "dr_grpo"),
    "dapo": ("clipped", "dapo"),
    "cispo": ("cispo", "dapo"),  # TRL: CISPO normalises by the global token count, like dapo
    "sapo": ("sapo", "grpo"),  # TRL: SAPO aggregates like grpo
    "luspo": ("clipped", "luspo"),  # TRL: the clipped objective, summed per sequence, mean over sequences
    "vespo": ("vespo", "dapo"),  # TRL: VESPO normalises by the global token count, like dapo
}
"""loss_type -> (objective name in ``objectives.OBJECTIVES``, aggregation name in
``aggregation.AGGREGATIONS``)."""

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence", "sequence_token")
"""``importance_ratio``'s levels: one ratio per token, GSPO's one per sequence, or GSPO-token."""

IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
"""TRL's ``vllm_importance_sampling_mode`` values: granularity (token / sequence) x constraint (truncate /
mask)."""

SCALES = ("group", "batch", "none")
"""``group_advantages``' reward scalings: the group's std, the batch's std, or none (Dr. GRPO)."""

MULTI_REWARD_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
"""How several reward functions become one advantage: weighted sum then normalise, or GDPO's reverse."""
