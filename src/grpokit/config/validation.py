"""Validation of ``GRPOConfig`` fields: ranges and agreements, each failure a ValueError naming the field.

Kept apart from the config's field list so that file stays a readable list of knobs; ``GRPOConfig`` calls
``validate_fields`` at construction (the loss fields are validated by building the loss, the batch sizes by
planning a step: see ``GRPOConfig._validate``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["require", "validate_fields"]


def require(condition: bool, name: str, why: str) -> None:
    """Raise ``ValueError("GRPOConfig.<name> <why>")`` unless ``condition``."""
    if not condition:
        raise ValueError(f"GRPOConfig.{name} {why}")


def validate_fields(config: Any) -> None:
    """Check every field of ``config`` (a GRPOConfig) on its own and against the others."""
    require(config.num_generations >= 2, "num_generations", "must be >= 2: a group of one has no baseline")
    require(config.per_device_train_batch_size >= 1, "per_device_train_batch_size", "must be >= 1")
    require(config.gradient_accumulation_steps >= 1, "gradient_accumulation_steps", "must be >= 1")
    require(config.num_iterations >= 1, "num_iterations", "must be >= 1")
    require(0 < config.top_entropy_quantile <= 1, "top_entropy_quantile", "must be in (0, 1]")
    require(config.temperature > 0, "temperature", "must be > 0 (use greedy evaluation instead)")
    require(0 < config.top_p <= 1, "top_p", "must be in (0, 1]")
    require(config.top_k >= 0, "top_k", "must be >= 0")
    require(0 <= config.min_p < 1, "min_p", "must be in [0, 1)")
    require(config.repetition_penalty > 0, "repetition_penalty", "must be > 0")
    require(config.max_completion_length >= 1, "max_completion_length", "must be >= 1")
    require(config.learning_rate >= 0, "learning_rate", "must be >= 0")
    require(config.max_nonfinite_steps >= 1, "max_nonfinite_steps", "must be >= 1")
    timeout = config.reward_timeout
    require(timeout is None or timeout > 0, "reward_timeout", "must be > 0 seconds (or None: unbounded)")
    if config.torch_num_threads is not None:
        require(config.torch_num_threads >= 0, "torch_num_threads", "must be >= 0 (0: torch's default)")
    require(
        not (config.gradient_checkpointing_kwargs or {}).get("use_reentrant", False),
        "gradient_checkpointing_kwargs",
        "use_reentrant=True is not supported: reentrant checkpointing drops the gradient of the prompt "
        "keys/values shared by a group's completions; leave it False",
    )
    unknown = set(config.fsdp.split()) - {"full_shard", "auto_wrap"}
    require(
        not unknown,
        "fsdp",
        f"options {sorted(unknown)} are not supported: use 'full_shard' (optionally with 'auto_wrap', "
        "which is what grpokit does: one FSDP unit per decoder layer), or '' for none",
    )
    require(0 <= config.warmup_ratio < 1, "warmup_ratio", "must be in [0, 1)")
    require(config.warmup_steps >= 0, "warmup_steps", "must be >= 0")
    if config.num_completions_to_print is not None:
        require(config.num_completions_to_print >= 0, "num_completions_to_print", "must be >= 0")
    require(config.max_steps != 0, "max_steps", "must be positive, or -1 to use num_train_epochs")
    require(config.max_steps > 0 or config.num_train_epochs > 0, "num_train_epochs", "must be > 0")
    require(0 < config.ref_model_mixup_alpha <= 1, "ref_model_mixup_alpha", "must be in (0, 1]")
    require(config.ref_model_sync_steps >= 1, "ref_model_sync_steps", "must be >= 1")
    if config.sync_ref_model:
        require(config.beta > 0, "sync_ref_model", "needs beta > 0: with beta 0 there is no reference")
    if config.reward_weights is not None:
        require(len(config.reward_weights) > 0, "reward_weights", "must not be empty")
    if config.process_reward_weights is not None:
        require(len(config.process_reward_weights) > 0, "process_reward_weights", "must not be empty")
    require(
        isinstance(config.step_delimiter, str) and config.step_delimiter != "",
        "step_delimiter",
        "must be a non-empty string",
    )
    for name in ("outcome_advantage_weight", "process_advantage_weight"):
        require(getattr(config, name) >= 0, name, "must be >= 0")
    require(
        config.outcome_advantage_weight > 0 or config.process_advantage_weight > 0,
        "process_advantage_weight",
        "and outcome_advantage_weight cannot both be 0: every advantage would be 0",
    )
    require(config.iteration_steps >= 0, "iteration_steps", "must be >= 0 (0 = no iterative updates)")
    if config.iteration_steps > 0:
        require(
            config.beta > 0,
            "iteration_steps",
            "needs beta > 0: iterative GRPO resets the reference model, and with beta 0 there is none",
        )
    require(0 <= config.replay_ratio < 1, "replay_ratio", "must be in [0, 1)")
    require(config.rm_learning_rate >= 0, "rm_learning_rate", "must be >= 0")
    require(config.rm_epochs >= 1, "rm_epochs", "must be >= 1")
    require(config.rm_batch_size >= 1, "rm_batch_size", "must be >= 1")
    if config.rm_buffer_capacity is not None:
        require(config.rm_buffer_capacity >= 1, "rm_buffer_capacity", "must be >= 1, or None for no limit")
    if config.generation_batch_size is not None:
        require(
            config.generation_batch_size % config.num_generations == 0,
            "generation_batch_size",
            f"({config.generation_batch_size}) must be a multiple of num_generations "
            f"({config.num_generations}) so that every group of G completions stays whole",
        )
