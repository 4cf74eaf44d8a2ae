"""Pure GRPO tensor math: advantages, KL estimators, policy losses, log-probs. Imports torch only."""

from .advantages import combine_rewards, group_advantages, multi_reward_advantages, process_advantages
from .aggregation import (
    AGGREGATION_IS_GLOBAL,
    AGGREGATIONS,
    bnpo_aggregation,
    dapo_aggregation,
    dr_grpo_aggregation,
    grpo_aggregation,
)
from .kl import kl_penalty
from .logprobs import entropy_from_logits, logprobs_and_entropy, selective_log_softmax
from .losses import (
    LOSS_PRESETS,
    aggregation_is_global,
    importance_sampling_weights,
    policy_loss,
    top_entropy_mask,
)
from .objectives import (
    OBJECTIVES,
    ObjectiveParams,
    cispo_objective,
    clipped_objective,
    importance_ratio,
    sapo_objective,
)

__all__ = [
    "AGGREGATIONS",
    "AGGREGATION_IS_GLOBAL",
    "LOSS_PRESETS",
    "OBJECTIVES",
    "ObjectiveParams",
    "aggregation_is_global",
    "bnpo_aggregation",
    "cispo_objective",
    "clipped_objective",
    "combine_rewards",
    "dapo_aggregation",
    "dr_grpo_aggregation",
    "entropy_from_logits",
    "group_advantages",
    "grpo_aggregation",
    "importance_ratio",
    "importance_sampling_weights",
    "kl_penalty",
    "logprobs_and_entropy",
    "multi_reward_advantages",
    "policy_loss",
    "process_advantages",
    "sapo_objective",
    "selective_log_softmax",
    "top_entropy_mask",
]
