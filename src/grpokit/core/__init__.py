"""Pure GRPO tensor math: advantages (equal or ragged groups), KL estimators, policy losses, log-probs,
padding. Imports torch only: no models, files or globals.

The names below load their module on first use, so that ``grpokit.core.choices`` (the names core's functions
accept: plain strings) is importable without torch; ``from grpokit.core import policy_loss`` works as usual.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "choices": (
        "IMPORTANCE_SAMPLING_LEVELS", "IS_MODES", "LOSS_PRESETS", "MULTI_REWARD_AGGREGATIONS", "SCALES",
    ),
    "advantages": (
        "combine_outcome_and_process", "combine_rewards", "group_advantages", "multi_reward_advantages",
        "process_advantages",
    ),
    "aggregation": (
        "AGGREGATION_IS_GLOBAL", "AGGREGATIONS", "bnpo_aggregation", "dapo_aggregation",
        "dr_grpo_aggregation", "grpo_aggregation", "luspo_aggregation",
    ),
    "entropy_control": ("adapted_entropy_coef", "applied_entropy_coef"),
    "group_sizes": ("allocate_group_sizes",),
    "kl": ("KL_ESTIMATORS", "kl_penalty"),
    "logprobs": ("entropy_from_logits", "logprobs_and_entropy", "selective_log_softmax"),
    "losses": ("LossConfigError", "PolicyLoss", "policy_loss"),
    "objectives": (
        "OBJECTIVES", "ObjectiveParams", "TokenTerms", "cispo_objective", "clipped_objective",
        "importance_ratio", "sapo_objective", "vespo_gamma_weights", "vespo_objective",
    ),
    "padding": ("pad_left", "pad_right", "trim_at_eos"),
    "ragged": ("group_mean_std", "pad_groups", "resolve_group_sizes", "unpad_groups"),
    "role_advantages": ("RoleBaselines", "role_group_sizes"),
    "token_weights": (
        "entropy_threshold", "importance_sampling_weights", "off_policy_sequence_mask", "top_entropy_mask",
    ),
}  # fmt: skip
"""module -> the public names it defines."""

_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    """Import the module that defines ``name`` on first use (PEP 562)."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
