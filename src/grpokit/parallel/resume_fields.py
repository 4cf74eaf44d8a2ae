"""What a resume may change: every ``GRPOConfig`` field is honoured (the new value applies from the next step,
logged), refused (the checkpoint's state was made with the old value, so continuing would silently train
something else), or not part of the run (the resume itself). docs/reliability.md shows this table; a test
checks that every field of ``GRPOConfig`` is in it, so a new field is classified when it is added.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpokit.config import GRPOConfig
from grpokit.config.trl_fields import TYPES

__all__ = ["FIELDS", "ResumeRule", "rule_for"]

HONOURED, REFUSED, NOT_COMPARED = "honoured", "refused", "not compared"


@dataclass(frozen=True)
class ResumeRule:
    """How a resume treats a change of one field: ``kind`` (honoured, refused, not compared) and ``why``
    (what the new value does, or why it cannot). ``refused_when``: a refused field refused only for some
    changes (e.g. ``beta`` crossing 0; the others are honoured, ``otherwise`` saying how); None: every
    change."""

    kind: str
    why: str
    refused_when: Callable[[Any, Any], bool] | None = None
    otherwise: str = "read from this run's config at every step"
    """Why a change that ``refused_when`` lets through is honoured."""

    def refuses(self, old: Any, new: Any) -> bool:
        if self.kind != REFUSED:
            return False
        return self.refused_when is None or self.refused_when(old, new)

    def honours(self, old: Any, new: Any) -> str | None:
        """How a change from ``old`` to ``new`` is honoured, or None when it is not."""
        if self.kind == HONOURED:
            return self.why
        if self.kind == REFUSED and not self.refuses(old, new):
            return self.otherwise
        return None


def _crosses_zero(old: Any, new: Any) -> bool:
    return ((old or 0) == 0) != ((new or 0) == 0)


EVERY_STEP = "read from this run's config at every step"
OPTIMIZER = "set on the optimizer after its state is restored (the checkpoint keeps only AdamW's moments)"
SCHEDULE = "the learning-rate schedule is rebuilt with it and continues from the checkpoint's optimizer step"
BATCH = (
    "the batch plan: the checkpoint's data position, group sizes and optimizer-step count (the schedule's "
    "position) were made with it"
)
ORDER = (
    "the data order: the checkpoint's position is in the order this value shuffled, and the restored random "
    "state continues the checkpoint's seed"
)
PASS_RATES = "the per-prompt pass rates saved in the checkpoint exist only with it on, counted as it was"

_GROUPS: list[tuple[tuple[str, ...], ResumeRule]] = [
    (("resume_from_checkpoint", "overwrite_output_dir"), ResumeRule(NOT_COMPARED, "the resume itself")),
    (("hub_token",), ResumeRule(NOT_COMPARED, "a secret: never written to a checkpoint")),
    (
        (
            "num_generations",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "steps_per_generation",
            "generation_batch_size",
            "num_iterations",
        ),
        ResumeRule(REFUSED, BATCH),
    ),
    (("seed", "data_seed", "shuffle_dataset"), ResumeRule(REFUSED, ORDER)),
    (
        ("fsdp", "deepspeed"),
        ResumeRule(
            REFUSED, "the checkpoint's files are written per placement (full states, or ZeRO's engine)"
        ),
    ),
    (
        ("model_init_kwargs",),
        ResumeRule(
            REFUSED, "how the policy was loaded (dtype, attention): the checkpoint's weights are that"
        ),
    ),
    (
        ("curriculum", "adaptive_num_generations", "curriculum_pass_threshold"),
        ResumeRule(REFUSED, PASS_RATES),
    ),
    (
        ("environment",),
        ResumeRule(REFUSED, "the environment is the task the checkpoint's policy was trained in"),
    ),
    (
        ("role_advantage",),
        ResumeRule(REFUSED, "the checkpoint's role baselines (rae) were kept for it, or none were kept"),
    ),
    (
        ("rm_buffer_capacity",),
        ResumeRule(REFUSED, "the iterative reward model's replay buffer in the checkpoint was kept for it"),
    ),
    (
        ("beta",),
        ResumeRule(
            REFUSED,
            "0 means no reference model: turning it on or off would start or drop the checkpoint's reference",
            _crosses_zero,
            "the new coefficient weighs the KL term from the next step",
        ),
    ),
    (
        ("iteration_steps",),
        ResumeRule(
            REFUSED,
            "0 means no iterative reward-model updates: turning them on or off changes what the checkpoint "
            "saved",
            _crosses_zero,
            "the reward model is updated at the new interval from the next step",
        ),
    ),
    (
        ("learning_rate", "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay", "optim"),
        ResumeRule(HONOURED, OPTIMIZER),
    ),
    (
        (
            "lr_scheduler_type",
            "lr_scheduler_kwargs",
            "warmup_ratio",
            "warmup_steps",
            "max_steps",
            "num_train_epochs",
            "max_steps_unit",
        ),
        ResumeRule(HONOURED, SCHEDULE),
    ),
]


EVERY_STEP_FIELDS: dict[str, str] = {
    "output, logging, evaluation, checkpoints, tracking, hub": (
        "output_dir logging_steps logging_first_step save_steps save_strategy save_total_limit "
        "eval_strategy eval_steps eval_on_start per_device_eval_batch_size num_generations_eval disable_tqdm "
        "log_completions num_completions_to_print log_multimodal report_to run_name project logging_dir "
        "push_to_hub hub_model_id hub_strategy hub_private_repo hub_revision"
    ),
    "the objective": (
        "epsilon epsilon_high delta loss_type importance_sampling_level use_bias_correction_kl "
        "scale_rewards mask_truncated_completions top_entropy_quantile entropy_coef sapo_temperature_pos "
        "sapo_temperature_neg vespo_k_pos vespo_lambda_pos vespo_k_neg vespo_lambda_neg "
        "off_policy_mask_threshold use_adaptive_entropy entropy_coef_min entropy_coef_max "
        "entropy_coef_delta entropy_target router_aux_loss_coef routing_replay reward_weights "
        "multi_objective_aggregation "
        "reward_failure "
        "reward_timeout advantage_epsilon max_grad_norm max_nonfinite_steps"
    ),
    "the reference model": (
        "sync_ref_model ref_model_sync_steps ref_model_mixup_alpha ref_model_dtype ref_model_offload"
    ),
    "generation": (
        "max_prompt_length max_completion_length temperature top_p top_k min_p repetition_penalty "
        "chat_template_kwargs generation_backend generation_micro_batch_size generation_kwargs "
        "generation_dtype prompt_truncation pad_to_multiple_of use_vllm vllm_mode vllm_model_impl "
        "vllm_enable_sleep_mode "
        "vllm_server_base_url vllm_server_host vllm_server_port vllm_server_timeout vllm_group_port "
        "vllm_gpu_memory_utilization vllm_max_model_length vllm_tensor_parallel_size "
        "vllm_importance_sampling_correction vllm_importance_sampling_mode "
        "vllm_importance_sampling_clip_max vllm_importance_sampling_clip_min "
        "vllm_importance_sampling_cap async_generation max_staleness reuse_sampler_logprobs compile_decode"
    ),
    "which groups a step trains on": (
        "dynamic_sampling max_sampling_rounds curriculum_min_pass_rate curriculum_max_pass_rate "
        "curriculum_min_samples curriculum_explore min_num_generations max_num_generations"
    ),
    "environments": (
        "environment_kwargs max_turns max_turn_tokens environment_timeout max_tool_calling_iterations "
        "turn_advantages game_opponent illegal_move_reward rae_decay snapshot_every snapshot_pool_size"
    ),
    # the training rows they select are compared themselves: a resume on other rows is refused
    "data settings": "prompt_column column_mapping",
    "precision, devices, memory": (
        "mixed_precision bf16 fp16 use_cpu torch_num_threads cpu_memory_reuse cpu_memory_reuse_below "
        "cpu_memory_reuse_in_backward cpu_memory_reuse_transient "
        "lean_activations gradient_checkpointing gradient_checkpointing_kwargs activation_checkpointing "
        "activation_checkpointing_kwargs padding_free "
        "micro_batch_tokens balance_micro_batches disable_dropout cast_lm_head_to_fp32 freeze_vision_tower "
        "trust_remote_code"
    ),
    "process supervision, iterative GRPO": (
        "step_delimiter process_reward_weights outcome_advantage_weight process_advantage_weight "
        "replay_ratio rm_learning_rate rm_epochs rm_batch_size"
    ),
    "watching a learned reward": "gold_reward proxy_threshold",
}
"""The fields honoured because the run reads them from its config at every step (or when it starts), by
what they are about (names separated by spaces)."""


TRL_ONLY = ResumeRule(NOT_COMPARED, "TRL's fields grpokit does not use (config.trl_fields): nothing changes")
SUBCLASS_FIELD = ResumeRule(NOT_COMPARED, "a field a subclass of GRPOConfig adds: grpokit does not read it")

FIELDS: dict[str, ResumeRule] = {
    **{name: rule for names, rule in _GROUPS for name in names},
    **dict.fromkeys(TYPES, TRL_ONLY),
    **{
        name: ResumeRule(HONOURED, EVERY_STEP)
        for names in EVERY_STEP_FIELDS.values()
        for name in names.split()
    },
}
"""field -> how a resume treats a change of it."""

UNLISTED = ResumeRule(
    REFUSED, "grpokit does not know whether a checkpoint's state survives a change of this field"
)


def rule_for(field: str) -> ResumeRule:
    """The rule of ``field``; one a subclass of GRPOConfig adds is not compared; any other missing from the
    table is refused (the safe side)."""
    if field not in FIELDS and field not in GRPOConfig.__dataclass_fields__:
        return SUBCLASS_FIELD
    return FIELDS.get(field, UNLISTED)
