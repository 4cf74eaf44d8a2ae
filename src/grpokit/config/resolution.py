"""What a config derives from the fields it was given, computed from them each time it is needed, never
stored by the constructor: a ``GRPOConfig`` holds what was set, so changing a source
(``dataclasses.replace(config, save_steps=4)``, a command-line override over a recipe) can never leave a stale
derived value behind.

``GRPOConfig.resolved()`` writes every derived value out once, when a run starts (``GRPOTrainer``), after
every source of the config has been merged; that resolved config is what the run uses and what
``grpokit train`` records in ``<output_dir>/config.yaml``. Intervals given as a ratio of the run
(``logging_steps=0.1``) are resolved later still, once the run's length is known
(``grpokit.train.schedule.RunSchedule``, with ``interval_steps`` below).
"""

from __future__ import annotations

import math
from typing import Any

from grpokit.config.values import field_types, typed

__all__ = [
    "GENERATION_KWARGS",
    "derived_values",
    "eval_steps",
    "eval_strategy",
    "importance_sampling_clip_max",
    "interval_steps",
    "max_num_generations",
    "mixed_precision",
    "policy_loss",
    "precision_unset",
    "sampling_fields",
    "save_strategy",
    "vllm_context_length",
]

GENERATION_KWARGS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_completion_length",
}
"""``generation_kwargs`` keys grpokit's samplers take -> the field each one takes precedence over (TRL)."""


def save_strategy(config: Any) -> str:
    """When checkpoints are saved. Unset: "steps" if ``save_steps`` > 0, else "no" (TRL). ``save_steps=0``
    means no periodic checkpoint, so "steps" with ``save_steps=0`` is "no" (as transformers does)."""
    if config.save_strategy in (None, "steps"):
        return "steps" if config.save_steps else "no"
    return config.save_strategy


def eval_strategy(config: Any) -> str:
    """When the eval set is evaluated. Unset: "steps" if ``eval_steps`` is set, else "no" (TRL)."""
    if config.eval_strategy is None:
        return "steps" if config.eval_steps is not None else "no"
    return config.eval_strategy


def eval_steps(config: Any) -> int | float | None:
    """Steps between evaluations under the "steps" strategy: ``eval_steps``, else ``logging_steps`` (TRL);
    None under the other strategies."""
    if eval_strategy(config) != "steps":
        return None
    return config.eval_steps if config.eval_steps is not None else config.logging_steps


def mixed_precision(config: Any, default: str = "no") -> str:
    """accelerate's mixed precision: TRL's ``bf16``/``fp16`` booleans name it too (validation refuses the
    two disagreeing with ``mixed_precision``). With none of the three set (``bf16`` None, the default):
    ``default``, the processor's choice that ``GRPOTrainer`` passes
    (``parallel.hardware.default_mixed_precision``: bf16 on a CPU with bf16 matrix units, else "no");
    ``bf16=False`` is fp32 whatever the processor."""
    if config.bf16:
        return "bf16"
    if config.fp16:
        return "fp16"
    return default if precision_unset(config) else config.mixed_precision


def precision_unset(config: Any) -> bool:
    """The config chooses no precision: ``bf16`` None, no ``fp16``, ``mixed_precision`` "no"."""
    return config.bf16 is None and not config.fp16 and config.mixed_precision == "no"


def max_num_generations(config: Any) -> int | None:
    """The largest adaptive group: ``max_num_generations``, or 2 x ``num_generations`` when unset; only with
    ``adaptive_num_generations`` (None without it)."""
    if not config.adaptive_num_generations:
        return config.max_num_generations
    given = config.max_num_generations
    return given if given is not None else 2 * config.num_generations


def importance_sampling_clip_max(config: Any) -> float | None:
    """The off-policy ratio's upper bound: TRL's deprecated ``vllm_importance_sampling_cap`` when set, else
    ``vllm_importance_sampling_clip_max``."""
    cap = config.vllm_importance_sampling_cap
    return cap if cap is not None else config.vllm_importance_sampling_clip_max


def vllm_context_length(max_prompt_length: int | None, max_completion_length: int) -> int | None:
    """The context a vLLM engine needs for a run: the longest prompt plus the completion budget (an episode
    with an environment, observations included, fits in the same budget after its prompt:
    ``envs.episodes``). None when prompts are not bounded (``max_prompt_length=None``)."""
    return None if max_prompt_length is None else max_prompt_length + max_completion_length


def sampling_fields(config: Any) -> dict[str, Any]:
    """``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty`` and ``max_completion_length``
    as the samplers use them: ``generation_kwargs`` takes precedence (TRL), each value typed by the field it
    sets. Keys grpokit's samplers do not take are refused by validation."""
    values = {name: getattr(config, name) for name in GENERATION_KWARGS.values()}
    types_ = field_types(type(config))
    for key, value in (config.generation_kwargs or {}).items():
        if key in GENERATION_KWARGS:
            name = GENERATION_KWARGS[key]
            values[name] = typed(types_[name], value, f"GRPOConfig.generation_kwargs[{key!r}]")
    return values


def derived_values(config: Any, default_precision: str = "no") -> dict[str, Any]:
    """Every derived field, by name, with the value a run uses (``GRPOConfig.resolved``). The deprecated cap
    becomes ``vllm_importance_sampling_clip_max`` and is cleared; ``bf16``/``fp16`` agree with
    ``mixed_precision`` (``default_precision`` when the config chooses none)."""
    precision = mixed_precision(config, default_precision)
    return {
        "save_strategy": save_strategy(config),
        "eval_strategy": eval_strategy(config),
        "eval_steps": eval_steps(config),
        "mixed_precision": precision,
        "bf16": precision == "bf16",
        "fp16": precision == "fp16",
        "max_num_generations": max_num_generations(config),
        "vllm_importance_sampling_clip_max": importance_sampling_clip_max(config),
        "vllm_importance_sampling_cap": None,
        **sampling_fields(config),
    }


def policy_loss(config: Any) -> Any:
    """The run's ``core.PolicyLoss``: the loss fields of ``config`` (loss_type, epsilon(_high), delta, beta,
    importance_sampling_level, ...), validated where the loss is defined (``LossConfigError``). Imported
    here so that ``import grpokit`` does not import torch."""
    from dataclasses import fields

    from grpokit.core.losses import PolicyLoss

    return PolicyLoss(**{item.name: getattr(config, item.name) for item in fields(PolicyLoss)
                         if hasattr(config, item.name)})  # fmt: skip


def interval_steps(every: int | float, total_steps: int) -> int:
    """A logging/eval/save interval in GRPO steps: a whole number as is; a ratio in (0, 1) of the run's
    ``total_steps`` -> ``ceil(ratio x total_steps)`` (TRL's rule), at least 1."""
    if isinstance(every, float) and 0 < every < 1:
        return max(1, math.ceil(every * total_steps))
    return int(every)
