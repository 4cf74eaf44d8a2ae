"""Pure GRPO tensor math: advantages, KL estimators, policy losses, log-probs, padding.

Advantages of equal or ragged groups, objectives and aggregations, token weights. Imports torch only: no
models, files or globals."""

from .advantages import (
    combine_outcome_and_process,
    combine_rewards,
    group_advantages,
    multi_reward_advantages,
    process_advantages,
)
from .aggregation import (
    AGGREGATION_IS_GLOBAL,
    AGGREGATIONS,
    bnpo_aggregation,
    dapo_aggregation,
    dr_grpo_aggregation,
    grpo_aggregation,
)
from .group_sizes import allocate_group_sizes
from .kl import KL_ESTIMATORS, kl_penalty
from .logprobs import entropy_from_logits, logprobs_and_entropy, selective_log_softmax
from .losses import LOSS_PRESETS, LossConfigError, PolicyLoss, policy_loss
from .objectives import (
    IMPORTANCE_SAMPLING_LEVELS,
    OBJECTIVES,
    ObjectiveParams,
    cispo_objective,
    clipped_objective,
    importance_ratio,
    sapo_objective,
)
from .padding import pad_left, pad_right, trim_at_eos
from .ragged import group_mean_std, pad_groups, resolve_group_sizes, unpad_groups
from .token_weights import importance_sampling_weights, top_entropy_mask

__all__ = [
    "AGGREGATIONS",
    "AGGREGATION_IS_GLOBAL",
    "IMPORTANCE_SAMPLING_LEVELS",
    "KL_ESTIMATORS",
    "LOSS_PRESETS",
    "OBJECTIVES",
    "LossConfigError",
    "ObjectiveParams",
    "PolicyLoss",
    "allocate_group_sizes",
    "bnpo_aggregation",
    "cispo_objective",
    "clipped_objective",
    "combine_outcome_and_process",
    "combine_rewards",
    "dapo_aggregation",
    "dr_grpo_aggregation",
    "entropy_from_logits",
    "group_advantages",
    "group_mean_std",
    "grpo_aggregation",
    "importance_ratio",
    "importance_sampling_weights",
    "kl_penalty",
    "logprobs_and_entropy",
    "multi_reward_advantages",
    "pad_groups",
    "pad_left",
    "pad_right",
    "policy_loss",
    "process_advantages",
    "resolve_group_sizes",
    "sapo_objective",
    "selective_log_softmax",
    "top_entropy_mask",
    "trim_at_eos",
    "unpad_groups",
]
