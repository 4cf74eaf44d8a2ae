"""TRL's ``GRPOConfig`` fields that grpokit does not have, and what happens when a ported script sets one.

A TRL field is one of three things in grpokit:

1. a ``GRPOConfig`` field with TRL's meaning (most of them; ``grpokit.config.grpo_config``);
2. ``NO_EFFECT``: a field that cannot change what grpokit computes (grpokit has no DataLoader, no
   ``Trainer`` log levels...). Accepted with any value; setting one logs
   the reason, so nothing a user sets disappears silently;
3. ``REFUSED``: a feature grpokit does not implement. Accepted at values that leave the feature off (TRL's
   default, or an equivalent), otherwise refused with a ``ValueError`` saying why and what to use instead.

Never a ``TypeError``: ``GRPOConfig``'s constructor passes its keywords through ``split_trl_fields`` before
setting its own fields. The list follows TRL 1.16 (``tests/test_trl_parity.py`` holds its field names).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from typing import Any

from grpokit.data.integrity import InputError

__all__ = ["NO_EFFECT", "REFUSED", "TYPES", "check_trl_fields", "refuse_trainer_arguments", "trl_only_fields"]

logger = logging.getLogger("grpokit")

_DATALOADER = "grpokit indexes the prompts in memory and has no DataLoader"
_DDP = "grpokit wraps the policy itself (docs/scaling.md) and sets the DDP options it needs"
_LOGGING = "grpokit logs through Python logging and metrics.jsonl, not the Trainer's log levels"
_SCRIPT = "it only tells TRL's example scripts what to run; grpokit's train() always trains"

NO_EFFECT: dict[str, str] = {
    "do_train": _SCRIPT,
    "do_eval": _SCRIPT,
    "do_predict": _SCRIPT,
    "local_rank": "launchers set it; grpokit reads the process layout from accelerate",
    "dataloader_num_workers": _DATALOADER,
    "dataloader_pin_memory": _DATALOADER,
    "dataloader_persistent_workers": _DATALOADER,
    "dataloader_prefetch_factor": _DATALOADER,
    "dataloader_multiprocessing_context": _DATALOADER,
    "dataloader_in_order": _DATALOADER,
    "label_names": "a GRPO batch has no labels",
    "length_column_name": "grpokit does not group prompts by length",
    "ddp_find_unused_parameters": _DDP,
    "ddp_bucket_cap_mb": _DDP,
    "ddp_broadcast_buffers": _DDP,
    "ddp_static_graph": _DDP,
    "log_level": _LOGGING,
    "log_level_replica": _LOGGING,
    "log_on_each_node": "only the main process writes metrics",
    "skip_memory_metrics": "grpokit does not track memory in its metrics",
    "use_cache": "grpokit's generation always uses a KV cache and its training passes never do",
    "eval_do_concat_batches": "grpokit's evaluation reports reward means, not predictions",
    "eval_use_gather_object": "grpokit's evaluation gathers rewards with gather_object already",
    "logging_nan_inf_filter": "grpokit logs a NaN/inf metric as null and skips (and counts) NaN/inf steps",
}

# name -> (values that leave the feature off, why grpokit refuses any other value)
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "ds3_gather_for_generation": (
        (True,),
        "ZeRO-3 generation gathers the full weights for each generation call (TRL's default), one "
        "parameter at a time into a copy released after it; generating through per-module gathers is not "
        "offered",
    ),
    "vllm_structured_outputs_regex": (
        (None,),
        "structured outputs (regex-constrained decoding) are not supported by grpokit's vLLM backend",
    ),
    "dataloader_drop_last": ((False,), "grpokit never drops prompts: the order wraps into the next epoch"),
    "remove_unused_columns": ((False,), "grpokit always forwards every column to the reward functions"),
    "ignore_data_skip": ((False,), "a resume always restores the data position exactly"),
    "optim_args": ((None, ""), "optim is AdamW with adam_beta1/adam_beta2/adam_epsilon/weight_decay"),
    "optim_target_modules": ((None,), "only AdamW is supported (optim)"),
    "average_tokens_across_devices": (
        (True,),
        "grpokit's loss_type fixes each loss's normaliser over the global batch (docs/objectives.md)",
    ),
    "label_smoothing_factor": ((0, 0.0), "a GRPO loss has no labels to smooth"),
    "bf16_full_eval": ((False,), "evaluation runs under the training's mixed_precision"),
    "fp16_full_eval": ((False,), "evaluation runs under the training's mixed_precision"),
    "tf32": (
        (None, False),
        "set torch.backends.cuda.matmul.allow_tf32 in your script; grpokit does not change global torch "
        "settings",
    ),
    "torch_compile": ((False,), "torch.compile is not supported yet"),
    "torch_compile_backend": ((None,), "torch.compile is not supported yet"),
    "torch_compile_mode": ((None,), "torch.compile is not supported yet"),
    "use_liger_kernel": (
        (False,),
        "Liger kernels are not supported; grpokit's chunked log-prob pass "
        "(docs/performance.md) already avoids the full [B, T, V] logits",
    ),
    "liger_kernel_config": ((None,), "Liger kernels are not supported"),
    "neftune_noise_alpha": ((None,), "NEFTune is a supervised fine-tuning method"),
    "torch_empty_cache_steps": ((None,), "not supported"),
    "auto_find_batch_size": ((False,), "set per_device_train_batch_size; `grpokit plan` estimates memory"),
    "logging_strategy": (("steps",), "metrics are logged every logging_steps GRPO steps"),
    "include_num_input_tokens_seen": (("no", False), "grpokit logs num_tokens (completion tokens) per step"),
    "trackio_space_id": ((None,), "trackio runs locally here (report_to='trackio'); sync the space yourself"),
    "trackio_bucket_id": ((None,), "trackio runs locally here (report_to='trackio')"),
    "trackio_static_space_id": ((None,), "trackio runs locally here (report_to='trackio')"),
    "eval_delay": ((0, 0.0), "use eval_strategy/eval_steps"),
    "prediction_loss_only": ((False,), "grpokit's evaluation reports its rewards and eval_loss together"),
    "eval_accumulation_steps": ((None,), "grpokit's evaluation reports rewards, not predictions"),
    "include_for_metrics": (((), []), "grpokit's evaluation reports rewards (eval/reward)"),
    "batch_eval_metrics": ((False,), "grpokit's evaluation reports rewards (eval/reward)"),
    "save_only_model": ((False,), "checkpoints always hold what an exact resume needs"),
    "save_on_each_node": ((False,), "the main process saves; every process can read a shared output_dir"),
    "enable_jit_checkpoint": ((False,), "SIGTERM/SIGINT already save a checkpoint at the next step boundary"),
    "hub_always_push": ((False,), "a push waits for the previous one (hub_strategy)"),
    "load_best_model_at_end": ((False,), "the final model is the last policy; keep checkpoints to compare"),
    "metric_for_best_model": ((None,), "the final model is the last policy (load_best_model_at_end)"),
    "greater_is_better": ((None,), "the final model is the last policy (load_best_model_at_end)"),
    "restore_callback_states_from_checkpoint": ((False,), "callbacks keep no state across a resume"),
    "full_determinism": (
        (False,),
        "runs are reproducible from seed on a fixed machine; deterministic kernels are not forced",
    ),
    "accelerator_config": (
        (None, {"dispatch_batches": False}),
        "grpokit builds its Accelerator from mixed_precision/use_cpu; every process draws its own prompts "
        "(dispatch_batches=False, accepted)",
    ),
    "parallelism_config": ((None,), "use fsdp or deepspeed (docs/scaling.md)"),
    "train_sampling_strategy": (("random",), "prompts are shuffled per epoch (shuffle_dataset)"),
    "ddp_backend": ((None,), "accelerate picks nccl on GPUs and gloo on CPUs"),
    "ddp_timeout": ((1800,), "the process-group timeout is accelerate's default (1800 s)"),
    "fsdp_config": ((None,), "fsdp='full_shard' shards per decoder layer with the policy's mixed_precision"),
    "debug": (("", None, [], [""]), "not supported"),
    "cache_implementation": ((None,), "generation uses the backend's own KV cache"),
    "log_unique_prompts": ((False,), "completions.jsonl (log_completions) holds every prompt"),
    "log_completions_hub_repo": ((None,), "completions go to <output_dir>/completions.jsonl"),
    "use_transformers_continuous_batching": ((False,), "use generation_backend ('fast' shares the prefill)"),
    "transformers_continuous_batching_config": ((None,), "use generation_backend"),
    "use_transformers_paged": ((False,), "use generation_backend"),
}


_MAPPING = dict | str | None
"""A TRL mapping field: a dict, or its JSON text (as ``HfArgumentParser`` gives it from the command line)."""

TYPES: dict[str, tuple[Any, Any]] = {
    # name: (type, TRL 1.16's default), types as HfArgumentParser reads them
    "optim_args": (str | None, None),
    "optim_target_modules": (None | str | list[str], None),
    "average_tokens_across_devices": (bool, True),
    "label_smoothing_factor": (float, 0.0),
    "bf16_full_eval": (bool, False),
    "fp16_full_eval": (bool, False),
    "tf32": (bool | None, None),
    "torch_compile": (bool, False),
    "torch_compile_backend": (str | None, None),
    "torch_compile_mode": (str | None, None),
    "use_liger_kernel": (bool, False),
    "liger_kernel_config": (_MAPPING, None),
    "use_cache": (bool, False),
    "neftune_noise_alpha": (float | None, None),
    "torch_empty_cache_steps": (int | None, None),
    "auto_find_batch_size": (bool, False),
    "logging_strategy": (str, "steps"),
    "log_on_each_node": (bool, True),
    "logging_nan_inf_filter": (bool, True),
    "include_num_input_tokens_seen": (str | bool, "no"),
    "log_level": (str, "passive"),
    "log_level_replica": (str, "warning"),
    "trackio_space_id": (str | None, None),
    "trackio_bucket_id": (str | None, None),
    "trackio_static_space_id": (str | None, None),
    "eval_delay": (float, 0.0),
    "prediction_loss_only": (bool, False),
    "eval_do_concat_batches": (bool, True),
    "eval_use_gather_object": (bool, False),
    "eval_accumulation_steps": (int | None, None),
    "include_for_metrics": (list[str], ()),
    "batch_eval_metrics": (bool, False),
    "save_only_model": (bool, False),
    "save_on_each_node": (bool, False),
    "enable_jit_checkpoint": (bool, False),
    "hub_always_push": (bool, False),
    "load_best_model_at_end": (bool, False),
    "metric_for_best_model": (str | None, None),
    "greater_is_better": (bool | None, None),
    "ignore_data_skip": (bool, False),
    "restore_callback_states_from_checkpoint": (bool, False),
    "full_determinism": (bool, False),
    "accelerator_config": (_MAPPING, None),
    "parallelism_config": (str | None, None),
    "dataloader_drop_last": (bool, False),
    "dataloader_num_workers": (int, 0),
    "dataloader_pin_memory": (bool, True),
    "dataloader_persistent_workers": (bool, False),
    "dataloader_prefetch_factor": (int | None, None),
    "dataloader_multiprocessing_context": (str | None, None),
    "dataloader_in_order": (bool, True),
    "remove_unused_columns": (bool | None, False),
    "label_names": (list[str] | None, None),
    "train_sampling_strategy": (str, "random"),
    "length_column_name": (str, "length"),
    "ddp_find_unused_parameters": (bool | None, None),
    "ddp_bucket_cap_mb": (int | None, None),
    "ddp_broadcast_buffers": (bool | None, None),
    "ddp_static_graph": (bool | None, None),
    "ddp_backend": (str | None, None),
    "ddp_timeout": (int, 1800),
    "fsdp_config": (_MAPPING, None),
    "debug": (str | list[str], ""),
    "skip_memory_metrics": (bool, True),
    "do_train": (bool, False),
    "do_eval": (bool, False),
    "do_predict": (bool, False),
    "local_rank": (int, -1),
    "ds3_gather_for_generation": (bool, True),
    "cache_implementation": (str | None, None),
    "vllm_structured_outputs_regex": (str | None, None),
    "log_unique_prompts": (bool, False),
    "log_completions_hub_repo": (str | None, None),
    "use_transformers_continuous_batching": (bool, False),
    "transformers_continuous_batching_config": (_MAPPING, None),
    "use_transformers_paged": (bool, False),
}
"""Every TRL 1.16 ``GRPOConfig`` field grpokit does not use, as a field of ``GRPOConfig`` (so that TRL's
command-line flags and YAML keys exist), with TRL's default; ``NO_EFFECT`` or ``REFUSED`` says what a value
does. ``tests/test_trl_parity.py`` checks the names and defaults against TRL's dataclass."""


def trl_only_fields() -> list[tuple[str, Any, dataclasses.Field]]:
    """``(name, type, field)`` of each TRL-only field, for ``dataclasses.make_dataclass``: TRL's default,
    and what the field does here as its help text (``--help``)."""
    out = []
    for name, (kind, default) in TYPES.items():
        why = NO_EFFECT.get(name) or REFUSED[name][1]
        help_text = f"TRL's; {'no effect here' if name in NO_EFFECT else 'only its default here'}: {why}"
        if isinstance(default, tuple):  # a list default
            spec = dataclasses.field(default_factory=list, metadata={"help": help_text})
        else:
            spec = dataclasses.field(default=default, metadata={"help": help_text})
        out.append((name, kind, spec))
    return out


_BOOL_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def check_trl_fields(values: Mapping[str, Any], owner: str = "GRPOConfig") -> None:
    """TRL's fields grpokit does not use, among ``values``: a refused feature that is turned on raises an
    InputError with the reason; a no-effect field set away from TRL's default is logged. Other names are
    left alone."""
    for name, value in values.items():
        if name in REFUSED:
            allowed, why = REFUSED[name]
            if not any(_same(_parsed(value), ok) for ok in allowed):
                raise InputError(f"{owner}.{name}={value!r} is not supported: {why}")
        elif name in NO_EFFECT and not _same(_parsed(value), TYPES[name][1]):
            logger.info("%s.%s=%r has no effect in grpokit: %s", owner, name, value, NO_EFFECT[name])


def _parsed(value: Any) -> Any:
    """A mapping given as its JSON text (the command line's form), read; anything else as given."""
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _same(value: Any, allowed: Any) -> bool:
    """Equal, without True == 1 or [] == () surprises; a boolean may be given as a word (``no``, ``true``),
    as the command line and YAML 1.2 give it."""
    if isinstance(allowed, bool) and isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
        return _BOOL_WORDS[value.strip().lower()] is allowed
    if isinstance(allowed, (list, tuple)):
        return isinstance(value, (list, tuple)) and list(value) == list(allowed)
    if isinstance(allowed, str) and isinstance(value, bool):
        return allowed.strip().lower() in _BOOL_WORDS and _BOOL_WORDS[allowed.strip().lower()] is value
    if isinstance(allowed, bool) or isinstance(value, bool) or allowed is None:
        return value is allowed
    return value == allowed


_TRAINER_ARGUMENTS = {
    "quantization_config": "quantised (bitsandbytes) policies are not supported yet; load the weights in "
    "bfloat16 (model_init_kwargs={dtype: bfloat16}) and use peft_config for LoRA",
    "rollout_func": "pass a rollout_backend (the RolloutBackend protocol, grpokit.rollout) instead",
}


def refuse_trainer_arguments(**arguments: Any) -> None:
    """TRL's ``GRPOTrainer`` arguments grpokit does not support: None is accepted, anything else refused
    with the reason."""
    for name, value in arguments.items():
        if value is not None:
            raise InputError(f"GRPOTrainer({name}=...) is not supported: {_TRAINER_ARGUMENTS[name]}")
