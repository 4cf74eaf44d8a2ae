"""Every check of a ``GRPOConfig``, in one place: each field's range and the fields' agreement, run once at
construction (``validate``). A failure is a ValueError of one sentence: ``GRPOConfig.<field>``, the value,
what is wrong and what to do.

The checks read the config as a run will use it (the derived values of ``config.resolution`` applied,
``generation_kwargs`` included), without storing anything. The loss fields are checked by building the run's
``PolicyLoss``, the batch sizes by planning a step (``config.batch_plan``). What needs the trainer's inputs
(an eval set for ``eval_strategy``) is checked by ``check_eval_dataset`` when the run starts.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from types import SimpleNamespace
from typing import Any

from grpokit.config import resolution
from grpokit.config.batch_plan import plan_batch
from grpokit.config.choices import SINKS
from grpokit.config.trl_fields import TYPES, check_trl_fields
from grpokit.config.values import require
from grpokit.data.integrity import InputError

__all__ = ["check_eval_dataset", "check_sampling_values", "require", "validate"]

logger = logging.getLogger("grpokit")

MAX_SEED = 2**32 - 1
"""numpy's (and so ``accelerate.set_seed``'s) largest seed."""


def validate(config: Any) -> None:
    """Check every field of ``config`` (a GRPOConfig) on its own and against the others."""
    _check_generation_kwargs(config)
    view = SimpleNamespace(**{f.name: getattr(config, f.name) for f in dataclasses.fields(config)})
    view.__dict__.update(resolution.derived_values(config))  # the config as a run uses it
    for check in (
        _check_schedule, _check_intervals, _check_batch, _check_objective, _check_reference,
        _check_generation, _check_vllm, _check_correction, _check_sampling, _check_optimisation,
        _check_precision, _check_environment, _check_process_supervision, _check_iterative, _check_gold,
        _check_data, _check_tracking,
    ):  # fmt: skip
        check(view)
    _check_precision_flags(config)
    check_trl_fields({name: getattr(config, name) for name in TYPES})  # TRL's fields grpokit does not use
    _check_unused(config)
    _check_loss(view)
    plan_batch(view, num_processes=1)  # the batch sizes fit together


def check_eval_dataset(config: Any, has_eval_dataset: bool, what_to_do: str) -> None:
    """An evaluation schedule (``eval_strategy`` "steps"/"epoch", set or derived from ``eval_steps``) or
    ``eval_on_start`` without an eval set is refused, as TRL refuses it, rather than never evaluating;
    ``what_to_do`` says how to give one (to ``GRPOTrainer``, or on the command line)."""
    if has_eval_dataset:
        return
    strategy = resolution.eval_strategy(config)
    if strategy != "no":
        given = (
            f"eval_strategy={strategy!r}"
            if config.eval_strategy is not None
            else f"eval_steps={config.eval_steps!r} (which sets eval_strategy='steps')"
        )
        raise InputError(
            f"GRPOConfig.{given} needs an eval_dataset to evaluate: {what_to_do}, or set eval_strategy='no'"
        )
    require(
        not config.eval_on_start,
        "eval_on_start",
        f"=True needs an eval_dataset to evaluate: {what_to_do}, or set eval_on_start=False",
    )


# ---- one check per concern ---------------------------------------------------------------------------------
def _at_least(config: Any, name: str, minimum: int | float, *, none: str | None = None) -> None:
    """``name`` is >= ``minimum``; with ``none``, None is allowed too and means ``none``."""
    value = getattr(config, name)
    if value is None and none is not None:
        return
    alternative = f" (or None: {none})" if none is not None else ""
    require(value >= minimum, name, f"must be >= {minimum}{alternative}, got {value!r}")


def _in_range(config: Any, name: str, low: float, high: float, *, closed: str = "[)") -> None:
    """``name`` lies in the interval from ``low`` to ``high`` (``closed``: which ends are included)."""
    value = getattr(config, name)
    above = value >= low if closed[0] == "[" else value > low
    below = value <= high if closed[1] == "]" else value < high
    require(above and below, name, f"must be in {closed[0]}{low}, {high}{closed[1]}, got {value!r}")


def _check_schedule(c: Any) -> None:
    require(c.output_dir != "", "output_dir", "must name a directory, got ''")
    require(
        c.max_steps == -1 or c.max_steps >= 1,
        "max_steps",
        f"must be >= 1, or -1 to run num_train_epochs passes over the prompts, got {c.max_steps}",
    )
    if c.max_steps == -1:
        require(
            c.num_train_epochs > 0,
            "num_train_epochs",
            f"must be > 0 when max_steps is -1, got {c.num_train_epochs}; set max_steps or a positive "
            "num_train_epochs",
        )
    for name in ("seed", "data_seed"):
        value = getattr(c, name)
        if value is not None:
            require(0 <= value <= MAX_SEED, name, f"must be in [0, 2**32 - 1] (numpy's seeds), got {value}")
    _at_least(c, "per_device_eval_batch_size", 1)
    _at_least(c, "num_generations_eval", 1, none="one greedy completion per eval prompt")
    _at_least(c, "num_completions_to_print", 0, none="print none")
    _at_least(c, "save_total_limit", 1, none="keep every checkpoint")


def _check_intervals(c: Any) -> None:
    """``logging_steps`` / ``eval_steps`` / ``save_steps``: TRL's forms, a whole number of steps >= 1, or a
    ratio in (0, 1) of the run's steps; ``save_steps`` may also be 0 (no periodic checkpoint)."""
    _interval(c, "logging_steps", c.logging_steps)
    if c.eval_steps is not None:
        _interval(c, "eval_steps", c.eval_steps)
    if c.save_steps != 0:
        _interval(c, "save_steps", c.save_steps, zero="0 (no periodic checkpoint), ")


def _interval(c: Any, name: str, value: int | float, zero: str = "") -> None:
    ratio = isinstance(value, float) and 0 < value < 1
    whole = isinstance(value, int) and value >= 1
    require(
        ratio or whole,
        name,
        f"must be {zero}a whole number of steps >= 1 or a ratio in (0, 1) of the run's steps, got {value!r}",
    )


def _check_batch(c: Any) -> None:
    require(c.num_generations >= 2, "num_generations", f"must be >= 2: a group of one has no baseline, got "
            f"{c.num_generations}")  # fmt: skip
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "num_iterations"):
        _at_least(c, name, 1)
    _at_least(c, "micro_batch_tokens", 1, none="micro-batches of per_device_train_batch_size rows")
    if c.micro_batch_tokens is not None:
        require(
            c.loss_type != "bnpo",
            "micro_batch_tokens",
            "cannot be used with loss_type='bnpo', which normalises each micro-batch by its own token count: "
            "micro-batches filled by tokens would change its gradient; use per_device_train_batch_size",
        )
        require(
            c.top_entropy_quantile == 1.0,
            "micro_batch_tokens",
            f"cannot be used with top_entropy_quantile={c.top_entropy_quantile}: its entropy threshold is a "
            "quantile over each micro-batch's tokens; use per_device_train_batch_size",
        )
    _at_least(c, "steps_per_generation", 1, none="derived from generation_batch_size, else 1")
    _at_least(c, "generation_batch_size", 1, none="derived from the batch sizes")
    if c.generation_batch_size is not None:
        require(
            c.generation_batch_size % c.num_generations == 0,
            "generation_batch_size",
            f"({c.generation_batch_size}) must be a multiple of num_generations ({c.num_generations}) so "
            "that every group of G completions stays whole",
        )


def _check_objective(c: Any) -> None:
    _in_range(c, "top_entropy_quantile", 0, 1, closed="(]")
    require(math.isfinite(c.entropy_coef), "entropy_coef", f"must be a finite number, got {c.entropy_coef}")
    coef = c.router_aux_loss_coef
    require(
        coef is None or (math.isfinite(coef) and coef >= 0),
        "router_aux_loss_coef",
        f"must be a finite number >= 0 (or None: the model config's), got {coef!r}",
    )
    _check_adaptive_entropy(c)
    threshold = c.off_policy_mask_threshold
    require(
        threshold is None or (math.isfinite(threshold) and threshold >= 0),
        "off_policy_mask_threshold",
        f"must be a finite KL threshold >= 0 (e.g. 0.5) or None (off), got {threshold}",
    )
    pad = c.pad_to_multiple_of
    require(
        pad is None or pad == "auto" or (isinstance(pad, int) and pad >= 1),
        "pad_to_multiple_of",
        f"must be a whole number of tokens >= 1, 'auto' or None, got {pad!r}",
    )
    _at_least(c, "advantage_epsilon", 0)
    timeout = c.reward_timeout
    require(timeout is None or timeout > 0, "reward_timeout", "must be > 0 seconds (or None: unbounded)")
    for name in ("reward_weights", "process_reward_weights"):
        weights = getattr(c, name)
        require(weights is None or len(weights) > 0, name, "must not be empty (None: all 1.0)")


def _check_adaptive_entropy(c: Any) -> None:
    """The adaptive entropy controller's bounds, step and target (checked whether or not it is on, so that
    a config that turns it on later is already sound)."""
    for name in ("entropy_coef_min", "entropy_coef_max", "entropy_target"):
        value = getattr(c, name)
        require(math.isfinite(value) and value >= 0, name, f"must be a finite number >= 0, got {value}")
    require(
        c.entropy_coef_min <= c.entropy_coef_max,
        "entropy_coef_min",
        f"({c.entropy_coef_min}) must be <= entropy_coef_max ({c.entropy_coef_max})",
    )
    delta = c.entropy_coef_delta
    require(
        math.isfinite(delta) and delta > 0, "entropy_coef_delta", f"must be a finite number > 0, got {delta}"
    )


def _check_loss(c: Any) -> None:
    """The loss fields, by building the run's ``PolicyLoss`` (imported here so that ``import grpokit`` does
    not import torch)."""
    from grpokit.core.losses import LossConfigError

    try:
        resolution.policy_loss(c)
    except LossConfigError as err:
        raise InputError(f"GRPOConfig.{err.field} {err.why}") from None


def _check_reference(c: Any) -> None:
    _in_range(c, "ref_model_mixup_alpha", 0, 1, closed="(]")
    _at_least(c, "ref_model_sync_steps", 1)
    if c.sync_ref_model:
        require(c.beta > 0, "sync_ref_model", "needs beta > 0: with beta 0 there is no reference")


def check_sampling_values(
    *, temperature: float, top_p: float, top_k: int, owner: str = "GRPOConfig.", greedy_allowed: bool = False
) -> None:
    """The sampling settings' ranges, one home for GRPOConfig's and ``grpokit eval``'s: temperature > 0
    (>= 0 with ``greedy_allowed``: 0 is greedy decoding), top_p in (0, 1], top_k >= 0 (0: off). ``owner``
    prefixes the field names in the message ("GRPOConfig.", or "" for a command's own options)."""

    def need(condition: bool, name: str, why: str) -> None:
        if not condition:
            raise InputError(f"{owner}{name} {why}")

    if greedy_allowed:
        need(math.isfinite(temperature) and temperature >= 0, "temperature",
             f"must be >= 0 (0: greedy decoding), got {temperature}")  # fmt: skip
    else:
        need(math.isfinite(temperature) and temperature > 0, "temperature",
             f"must be > 0, got {temperature} (evaluation is greedy)")  # fmt: skip
    need(0 < top_p <= 1, "top_p", f"must be in (0, 1], got {top_p!r} (1.0: off)")
    need(top_k >= 0, "top_k", f"must be >= 0, got {top_k!r} (0: off)")


def _check_generation(c: Any) -> None:
    check_sampling_values(temperature=c.temperature, top_p=c.top_p, top_k=c.top_k)
    _in_range(c, "min_p", 0, 1)
    require(c.repetition_penalty > 0, "repetition_penalty", f"must be > 0, got {c.repetition_penalty}")
    _at_least(c, "max_completion_length", 1)
    _at_least(c, "max_prompt_length", 1, none="keep prompts whole")
    _at_least(c, "generation_micro_batch_size", 1, none="all of a step's prompts in one call")
    if c.compile_decode:
        why = "compiles the fast sampler's decode step"
        require(not c.use_vllm, "compile_decode", f"{why}; with use_vllm the vLLM engine generates")
        require(c.generation_backend != "transformers", "compile_decode", f"{why}, not model.generate")
        require(not c.async_generation, "compile_decode", f"{why} in this thread, not with async_generation")


def _check_generation_kwargs(c: Any) -> None:
    for key, value in (c.generation_kwargs or {}).items():
        if key == "do_sample":  # GRPO samples; greedy groups would hold G copies of one completion
            require(
                value is True,
                "generation_kwargs",
                f"do_sample={value!r}: GRPO samples its G completions (do_sample=True, the default); greedy "
                "decoding would make every group G copies of one completion, with no advantage to learn from",
            )
            continue
        require(
            key in resolution.GENERATION_KWARGS,
            "generation_kwargs",
            f"key {key!r} is not supported: grpokit's sampler takes {sorted(resolution.GENERATION_KWARGS)}",
        )


def _check_vllm(c: Any) -> None:
    """The ``vllm_*`` ranges, whether or not ``use_vllm`` is set (a typo should not wait for the day vLLM is
    turned on). Whether vLLM and CUDA are there is checked when the trainer is built: a config may be
    written on a machine without a GPU."""
    _in_range(c, "vllm_gpu_memory_utilization", 0, 1, closed="(]")
    _at_least(c, "vllm_tensor_parallel_size", 1)
    require(
        not (c.use_vllm and c.vllm_mode == "colocate" and c.vllm_tensor_parallel_size > 1),
        "vllm_tensor_parallel_size",
        f"must be 1 with use_vllm and vllm_mode='colocate' (one engine per training process, on its GPU), "
        f"got {c.vllm_tensor_parallel_size}; serve a model that needs several GPUs with "
        "vllm_mode='server' and the server's --tensor-parallel-size",
    )
    _at_least(c, "vllm_max_model_length", 1, none="max_prompt_length + max_completion_length")
    needed = resolution.vllm_context_length(c.max_prompt_length, c.max_completion_length)
    given = c.vllm_max_model_length
    require(
        given is None or needed is None or given >= needed,
        "vllm_max_model_length",
        f"({given}) is shorter than max_prompt_length + max_completion_length ({c.max_prompt_length} + "
        f"{c.max_completion_length} = {needed}): vLLM stops a sequence at its context, so completions "
        f"would be cut before their budget; set vllm_max_model_length >= {needed}, or leave it None (then "
        f"{needed})",
    )
    for name in ("vllm_server_port", "vllm_group_port"):
        port = getattr(c, name)
        require(1 <= port <= 65535, name, f"must be a TCP port (1-65535), got {port}")
    _at_least(c, "vllm_server_timeout", 0)
    url = c.vllm_server_base_url
    require(
        url is None or url.startswith(("http://", "https://")),
        "vllm_server_base_url",
        f"must start with http:// or https://, got {url!r}",
    )


def _check_correction(c: Any) -> None:
    """The ``vllm_importance_sampling_*`` fields (the deprecated cap already in ``clip_max``)."""
    low, high = c.vllm_importance_sampling_clip_min, c.vllm_importance_sampling_clip_max
    for name, bound in (
        ("vllm_importance_sampling_clip_min", low),
        ("vllm_importance_sampling_clip_max", high),
    ):
        require(
            bound is None or bound > 0,
            name,
            f"must be > 0 (a bound on a ratio of probabilities) or None, got {bound}",
        )
    if low is not None and high is not None:
        require(
            low < high,
            "vllm_importance_sampling_clip_min",
            f"({low}) must be < vllm_importance_sampling_clip_max ({high})",
        )
    if c.vllm_importance_sampling_correction and c.vllm_importance_sampling_mode.endswith("_truncate"):
        require(
            low is not None or high is not None,
            "vllm_importance_sampling_clip_max",
            "and vllm_importance_sampling_clip_min cannot both be None with vllm_importance_sampling_mode="
            f"{c.vllm_importance_sampling_mode!r}: a truncation needs a bound",
        )
    _at_least(c, "max_staleness", 0)
    sequence_mode = c.vllm_importance_sampling_mode.startswith("sequence")
    require(
        not (
            c.loss_type == "vespo" and c.use_vllm and c.vllm_importance_sampling_correction and sequence_mode
        ),
        "vllm_importance_sampling_mode",
        "must be 'token_truncate' or 'token_mask' with loss_type='vespo' and the vLLM correction on (VESPO "
        "folds per-token corrections into its sequence weight, as TRL), got "
        f"{c.vllm_importance_sampling_mode!r}",
    )


def _check_sampling(c: Any) -> None:
    """Dynamic sampling, the curriculum and adaptive group sizes."""
    _at_least(c, "max_sampling_rounds", 1)
    _in_range(c, "curriculum_min_pass_rate", 0, 1)
    require(
        c.curriculum_min_pass_rate < c.curriculum_max_pass_rate <= 1,
        "curriculum_max_pass_rate",
        f"must be in (curriculum_min_pass_rate, 1] = ({c.curriculum_min_pass_rate}, 1], got "
        f"{c.curriculum_max_pass_rate}",
    )
    _at_least(c, "curriculum_min_samples", 1)
    require(0 < c.curriculum_explore <= 1, "curriculum_explore", f"must be in (0, 1]: a skipped prompt must "
            f"be able to come back, got {c.curriculum_explore}")  # fmt: skip
    require(c.min_num_generations >= 2, "min_num_generations", "must be >= 2: a group of one has no "
            f"baseline, got {c.min_num_generations}")  # fmt: skip
    if not c.adaptive_num_generations:
        return
    require(
        c.max_num_generations >= c.min_num_generations,
        "max_num_generations",
        f"({c.max_num_generations}) must be >= min_num_generations ({c.min_num_generations})",
    )
    require(
        not c.dynamic_sampling,
        "adaptive_num_generations",
        "and dynamic_sampling cannot be combined: adaptive groups already move samples to the prompts whose "
        "groups carry signal; choose one",
    )
    require(
        c.min_num_generations <= c.num_generations <= c.max_num_generations,
        "num_generations",
        f"({c.num_generations}) is the mean group size of adaptive_num_generations and must lie in "
        f"[min_num_generations, max_num_generations] = [{c.min_num_generations}, {c.max_num_generations}]",
    )


def _check_optimisation(c: Any) -> None:
    _at_least(c, "learning_rate", 0)
    _in_range(c, "warmup_ratio", 0, 1)
    _at_least(c, "warmup_steps", 0)
    require(
        not (c.warmup_steps > 0 and c.warmup_ratio > 0),
        "warmup_steps",
        f"({c.warmup_steps}) and warmup_ratio ({c.warmup_ratio}) are both set, and warmup_steps would "
        "silently win; set only one of them",
    )
    _at_least(c, "weight_decay", 0)
    for name in ("adam_beta1", "adam_beta2"):
        _in_range(c, name, 0, 1)
    require(c.adam_epsilon > 0, "adam_epsilon", f"must be > 0, got {c.adam_epsilon}")
    _at_least(c, "max_grad_norm", 0)
    _at_least(c, "max_nonfinite_steps", 1)
    _check_schedule_kwargs(c)


_SET_BY_THE_RUN = ("optimizer", "num_warmup_steps", "num_training_steps", "last_epoch")
"""Arguments of a schedule function that the run sets itself (not ``lr_scheduler_kwargs``)."""


def _check_schedule_kwargs(c: Any) -> None:
    """``lr_scheduler_kwargs`` must be arguments the ``lr_scheduler_type`` schedule takes: one it does not
    take would be an error when the optimizer is built, or silently ignored (``constant`` takes none)."""
    given = set(c.lr_scheduler_kwargs or {})
    if not given:
        return
    import inspect

    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION, SchedulerType

    function = TYPE_TO_SCHEDULER_FUNCTION[SchedulerType(c.lr_scheduler_type)]
    parameters = inspect.signature(function).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return  # (reduce_lr_on_plateau: passed on to torch's scheduler)
    taken = [name for name in parameters if name not in _SET_BY_THE_RUN]
    if c.lr_scheduler_type == "constant":
        taken = []  # transformers calls it with the optimizer alone
    unknown = sorted(given - set(taken))
    require(
        not unknown,
        "lr_scheduler_kwargs",
        f"{unknown} are not arguments of the {c.lr_scheduler_type!r} schedule (it takes "
        f"{', '.join(taken) if taken else 'none'}); remove them or choose another lr_scheduler_type",
    )


def _check_precision(c: Any) -> None:
    """Threads, checkpointing and FSDP options (``bf16``/``fp16`` against ``mixed_precision``: on the fields
    as set, ``_check_precision_flags``)."""
    _at_least(c, "torch_num_threads", 0, none="torch's default, lowered to the idle cores")
    below = c.cpu_memory_reuse_below
    require(
        below is None or (isinstance(below, int) and 4096 <= below <= 2**30),
        "cpu_memory_reuse_below",
        f"must be a size in bytes from 4096 (a page) to 2**30 (1 GiB), or None (every block up to 1 GiB "
        f"kept), got {below!r}",
    )
    require(
        not (c.gradient_checkpointing_kwargs or {}).get("use_reentrant", False),
        "gradient_checkpointing_kwargs",
        "use_reentrant=True is not supported: reentrant checkpointing drops the gradient of the prompt "
        "keys/values shared by a group's completions; leave it False",
    )
    unknown = set(c.fsdp.split()) - {"full_shard", "auto_wrap"}
    require(
        not unknown,
        "fsdp",
        f"options {sorted(unknown)} are not supported: use 'full_shard' (optionally with 'auto_wrap', "
        "which is what grpokit does: one FSDP unit per decoder layer), or '' for none",
    )


def _check_environment(c: Any) -> None:
    _at_least(c, "max_turns", 1)
    _at_least(c, "max_turn_tokens", 1, none="what is left of max_completion_length")
    timeout = c.environment_timeout
    require(
        timeout is None or timeout > 0,
        "environment_timeout",
        f"must be > 0 seconds (or None: unbounded), got {timeout}",
    )
    _at_least(c, "max_tool_calling_iterations", 0, none="max_turns")
    require(0.0 <= c.rae_decay < 1.0, "rae_decay", f"must be in [0, 1), got {c.rae_decay}")
    _at_least(c, "snapshot_every", 1)
    _at_least(c, "snapshot_pool_size", 1)
    require(
        c.role_advantage == "group" or not (c.dynamic_sampling or c.adaptive_num_generations),
        "role_advantage",
        "'rae' takes each return against a running baseline, not a group: dynamic_sampling and "
        "adaptive_num_generations (which select and size groups) do not apply; drop them or use 'group'",
    )


def _check_process_supervision(c: Any) -> None:
    require(
        isinstance(c.step_delimiter, str) and c.step_delimiter != "",
        "step_delimiter",
        f"must be a non-empty string, got {c.step_delimiter!r}",
    )
    for name in ("outcome_advantage_weight", "process_advantage_weight"):
        _at_least(c, name, 0)
    require(
        c.outcome_advantage_weight > 0 or c.process_advantage_weight > 0,
        "process_advantage_weight",
        "and outcome_advantage_weight cannot both be 0: every advantage would be 0",
    )


def _check_iterative(c: Any) -> None:
    _at_least(c, "iteration_steps", 0)
    if c.iteration_steps > 0:
        require(
            c.beta > 0,
            "iteration_steps",
            "needs beta > 0: iterative GRPO resets the reference model, and with beta 0 there is none",
        )
    _in_range(c, "replay_ratio", 0, 1)
    _at_least(c, "rm_learning_rate", 0)
    _at_least(c, "rm_epochs", 1)
    _at_least(c, "rm_batch_size", 1)
    _at_least(c, "rm_buffer_capacity", 1, none="no limit")


def _check_gold(c: Any) -> None:
    """The monitor-only gold reward: its name is checked against the run's reward functions at the start
    (``grpokit.reporting.proxy_gold.gold_reward_column``)."""
    require(c.gold_reward != "", "gold_reward", "must name a reward function (or be None), got ''")
    require(
        isinstance(c.proxy_threshold, (int, float)) and math.isfinite(c.proxy_threshold),
        "proxy_threshold",
        f"must be a finite number, got {c.proxy_threshold!r}",
    )


def _check_data(c: Any) -> None:
    require(c.prompt_column != "", "prompt_column", "must name a column, got ''")


def _check_tracking(c: Any) -> None:
    for name in c.report_to:
        require(
            name in (*SINKS, "all"),
            "report_to",
            f"names an unknown sink {name!r}; use {', '.join(SINKS)}, 'all' or 'none'",
        )


def _check_precision_flags(config: Any) -> None:
    """TRL's ``bf16``/``fp16`` name a ``mixed_precision``: they may not contradict it or each other."""
    require(not (config.bf16 and config.fp16), "bf16", "and fp16 cannot both be true; choose one")
    for flag, mode in ((config.bf16, "bf16"), (config.fp16, "fp16")):
        require(
            not flag or config.mixed_precision in ("no", mode),
            mode,
            f"=True contradicts mixed_precision={config.mixed_precision!r}; set only one of them",
        )


def _check_unused(config: Any) -> None:
    """Options that were set but would do nothing: refused (or, for TRL's defaults that a ported config
    always carries, logged), never silently ignored."""
    if config.eval_steps is not None and config.eval_strategy in ("no", "epoch"):
        raise InputError(
            f"GRPOConfig.eval_steps={config.eval_steps!r} has no effect with eval_strategy="
            f"{config.eval_strategy!r}; drop eval_steps, or set eval_strategy='steps'"
        )
    if config.max_num_generations is not None and not config.adaptive_num_generations:
        raise InputError(
            f"GRPOConfig.max_num_generations={config.max_num_generations} has no effect without "
            "adaptive_num_generations=True; drop it, or turn adaptive group sizes on"
        )
    if config.save_steps and config.save_strategy in ("no", "epoch"):
        logger.info("GRPOConfig.save_steps=%r is not used with save_strategy=%r", config.save_steps,
                    config.save_strategy)  # fmt: skip
    for key, value in (config.generation_kwargs or {}).items():
        name = resolution.GENERATION_KWARGS.get(key)
        if name is not None and getattr(config, name) != value:
            logger.info("GRPOConfig.generation_kwargs[%r]=%r takes precedence over %s=%r (as in TRL)",
                        key, value, name, getattr(config, name))  # fmt: skip
