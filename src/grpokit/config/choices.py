"""Every enumerated option of ``GRPOConfig``, one source list each, and the ``Literal`` field types made from
them (``Literal[LOSS_TYPES]`` is ``Literal["grpo", "bnpo", ...]``; tyro and the value checks read it).

Where the code that acts on a name lives below the config, the list is that code's own and is imported
from there: the loss presets, reward scalings, importance-sampling levels and modes from
``grpokit.core.choices``, the generation backends and vLLM modes from ``grpokit.rollout.choices`` (both
torch-free, so ``import grpokit`` stays light). The others are the config's: the code that reads them
(the schedule, the optimizer, the trackers) imports them from here.
"""

from __future__ import annotations

from typing import Literal

from grpokit.core.choices import (
    IMPORTANCE_SAMPLING_LEVELS,
    IS_MODES,
    LOSS_PRESETS,
    MULTI_REWARD_AGGREGATIONS,
    SCALES,
)
from grpokit.rollout.choices import GENERATION_BACKENDS, VLLM_MODEL_IMPLS, VLLM_MODES

__all__ = [
    "DTYPES",
    "GAME_OPPONENTS",
    "GENERATION_BACKENDS",
    "HUB_STRATEGIES",
    "IMPORTANCE_SAMPLING_LEVELS",
    "IS_MODES",
    "LITERALS",
    "LOSS_TYPES",
    "LR_SCHEDULER_TYPES",
    "MAX_STEPS_UNITS",
    "MIXED_PRECISIONS",
    "MULTI_OBJECTIVE_AGGREGATIONS",
    "OPTIMIZERS",
    "PROMPT_TRUNCATIONS",
    "REWARD_FAILURES",
    "ROLE_ADVANTAGES",
    "ROUTING_REPLAYS",
    "SCALE_REWARDS",
    "SINKS",
    "STRATEGIES",
    "VLLM_MODEL_IMPLS",
    "VLLM_MODES",
]

# ---- lists owned by the code that acts on them (core, rollout) ---------------------------------------------
LOSS_TYPES: tuple[str, ...] = tuple(LOSS_PRESETS)
"""``loss_type``: the presets of ``grpokit.core.choices.LOSS_PRESETS``."""
SCALE_REWARDS: tuple[str, ...] = SCALES
"""``scale_rewards``: ``grpokit.core.choices.SCALES``."""
MULTI_OBJECTIVE_AGGREGATIONS: tuple[str, ...] = MULTI_REWARD_AGGREGATIONS
"""``multi_objective_aggregation``: ``grpokit.core.choices.MULTI_REWARD_AGGREGATIONS``."""

# ---- lists owned by the config -----------------------------------------------------------------------------
STRATEGIES = ("no", "steps", "epoch")
"""``eval_strategy`` / ``save_strategy``: never, every ``*_steps`` steps, at the end of each epoch."""
MIXED_PRECISIONS = ("no", "fp16", "bf16")
"""``mixed_precision``: accelerate's autocast modes."""
DTYPES = ("auto", "float32", "bfloat16", "float16")
"""``generation_dtype`` / ``ref_model_dtype``: "auto" (the policy's) or a torch dtype's name."""
SINKS = ("tensorboard", "wandb", "trackio", "mlflow")
"""Metric sinks ``report_to`` may name (besides "all" and "none")."""
LR_SCHEDULER_TYPES = ("constant", "constant_with_warmup", "linear", "cosine")
"""``lr_scheduler_type``: ``transformers.get_scheduler`` names grpokit supports."""
OPTIMIZERS = ("adamw_torch", "adamw_torch_fused")
"""``optim``: AdamW's plain or fused kernel."""
HUB_STRATEGIES = ("end", "every_save")
"""``hub_strategy``: push at the end only, or also at each checkpoint."""
MAX_STEPS_UNITS = ("grpo_steps", "optimizer_steps")
"""``max_steps_unit``: what ``max_steps`` counts."""
PROMPT_TRUNCATIONS = ("left", "error")
"""``prompt_truncation``: cut a long prompt from the left, or refuse it."""
ROUTING_REPLAYS = ("off", "R2", "R3")
"""``routing_replay``: a mixture-of-experts policy's passes route by their own routers, or replay the old
policy's experts in the update (R2), or the sampler's in every pass (R3) (``models.routing_replay``)."""
GAME_OPPONENTS = ("self", "random", "expert", "pool")
"""``game_opponent``: who plays a game's other seats: ``grpokit.envs.selfplay.OPPONENTS`` (importing it here
would load the episode machinery, so a test checks the two agree)."""
ROLE_ADVANTAGES = ("group", "rae", "prompt")
"""``role_advantage``: a game's advantages by role groups, SPIRAL's role-conditioned baselines, or (the
ablation) one group per prompt whatever the seat."""
REWARD_FAILURES = ("raise", "none")
"""``reward_failure``: the failure policies of ``grpokit.rewards.scoring.score_completions`` (its
``ON_ERROR``; importing it here would load the reward functions, so a test checks the two agree)."""

# ---- the field types -------------------------------------------------------------------------------------
LossType = Literal[LOSS_TYPES]
ScaleRewards = Literal[SCALE_REWARDS]
ImportanceSamplingLevel = Literal[IMPORTANCE_SAMPLING_LEVELS]
MultiObjectiveAggregation = Literal[MULTI_OBJECTIVE_AGGREGATIONS]
ImportanceSamplingMode = Literal[IS_MODES]
GenerationBackend = Literal[GENERATION_BACKENDS]
VLLMMode = Literal[VLLM_MODES]
VLLMModelImpl = Literal[VLLM_MODEL_IMPLS]
Strategy = Literal[STRATEGIES]
MixedPrecision = Literal[MIXED_PRECISIONS]
Dtype = Literal[DTYPES]
LRSchedulerType = Literal[LR_SCHEDULER_TYPES]
Optimizer = Literal[OPTIMIZERS]
HubStrategy = Literal[HUB_STRATEGIES]
MaxStepsUnit = Literal[MAX_STEPS_UNITS]
PromptTruncation = Literal[PROMPT_TRUNCATIONS]
RewardFailure = Literal[REWARD_FAILURES]
RoutingReplay = Literal[ROUTING_REPLAYS]
GameOpponent = Literal[GAME_OPPONENTS]
RoleAdvantage = Literal[ROLE_ADVANTAGES]

LITERALS = {
    "loss_type": LossType,
    "scale_rewards": ScaleRewards,
    "importance_sampling_level": ImportanceSamplingLevel,
    "multi_objective_aggregation": MultiObjectiveAggregation,
    "vllm_importance_sampling_mode": ImportanceSamplingMode,
    "generation_backend": GenerationBackend,
    "vllm_mode": VLLMMode,
    "vllm_model_impl": VLLMModelImpl,
    "eval_strategy": Strategy,
    "save_strategy": Strategy,
    "mixed_precision": MixedPrecision,
    "generation_dtype": Dtype,
    "ref_model_dtype": Dtype,
    "lr_scheduler_type": LRSchedulerType,
    "optim": Optimizer,
    "hub_strategy": HubStrategy,
    "max_steps_unit": MaxStepsUnit,
    "prompt_truncation": PromptTruncation,
    "reward_failure": RewardFailure,
    "routing_replay": RoutingReplay,
    "game_opponent": GameOpponent,
    "role_advantage": RoleAdvantage,
}
"""Each enumerated field -> its ``Literal`` type (a test checks every GRPOConfig field with a Literal type is
here and uses it)."""

LEGACY_BOOLEANS = {"scale_rewards": {True: "group", False: "none"}}
"""Enumerated fields TRL still takes as booleans, and the choice each stands for (TRL maps them the same
way in its ``GRPOConfig.__post_init__``)."""
