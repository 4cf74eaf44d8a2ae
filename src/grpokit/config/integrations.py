"""The fields of ``GRPOConfig`` that connect a run to the world around it: where its data comes from, when
it evaluates and saves, where its metrics and model go, and TRL/transformers options that a ported script
sets. ``GRPOConfig`` inherits them; the GRPO knobs themselves are in ``grpokit.config``.

Every name is TRL's (``trl.GRPOConfig`` / ``transformers.TrainingArguments``, or TRL's ``ScriptArguments``
for the data set fields) with TRL's meaning, except ``prompt_column``, ``column_mapping``,
``prompt_truncation``, ``logging_dir`` (removed from transformers 5, still in many scripts) and
``max_steps_unit``. TRL fields grpokit does not have are checked by ``grpokit.config.trl_fields``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Strategy = Literal["no", "steps", "epoch"]


@dataclass
class IntegrationFields:
    """Data, evaluation, checkpoint, tracking and hub settings of a run (see ``GRPOConfig``)."""

    # ---- data sets (docs/data.md) ------------------------------------------------------------------
    dataset_config: str | None = None
    """Configuration (subset) name when ``train_dataset`` / ``eval_dataset`` is a data set name that
    ``datasets.load_dataset`` resolves (a hub id, or a local folder of data files; configs from its
    README.md)."""
    dataset_train_split: str = "train"
    """Split of a named (or folder) ``train_dataset`` to train on (TRL ScriptArguments' name)."""
    dataset_test_split: str = "test"
    """Split of a named (or folder) ``eval_dataset`` to evaluate on (TRL ScriptArguments' name)."""
    prompt_column: str = "prompt"
    """The column that holds the prompt (a string, or a list of chat messages)."""
    column_mapping: dict[str, str] | None = None
    """Rename columns before use, ``{source: target}``, e.g. ``{question: prompt, answer: solution}``;
    the renamed columns reach the reward functions under their new names."""
    prompt_truncation: Literal["left", "error"] = "left"
    """A prompt longer than ``max_prompt_length`` tokens: cut from the left (keeps the end of the prompt,
    where the question and the generation prompt are; TRL's behaviour) or refuse it with an error naming the
    row."""

    # ---- schedule units, evaluation and checkpoints ---------------------------------------------------
    max_steps_unit: Literal["grpo_steps", "optimizer_steps"] = "grpo_steps"
    """What ``max_steps`` counts. grpo_steps: generation rounds (grpokit's step). optimizer_steps: TRL's
    ``global_step``; the run takes ceil(max_steps / optimizer steps per GRPO step) GRPO steps. Use it to port
    a TRL step count unchanged. logging/eval/save intervals always count GRPO steps."""
    eval_strategy: Strategy | None = None
    """When to evaluate on ``eval_dataset``: "no", every ``eval_steps`` steps ("steps"), or at the end of
    each pass over the training prompts ("epoch"). None: "steps" if ``eval_steps`` is set, else "no"."""
    eval_steps: int | None = None
    """Steps between evaluations with ``eval_strategy="steps"``; None: ``logging_steps`` (as in TRL)."""
    eval_on_start: bool = False
    """Evaluate once before the first step (a baseline)."""
    per_device_eval_batch_size: int = 64
    """Prompts per greedy generation call in evaluation."""
    save_strategy: Strategy | None = None
    """When to save a resumable checkpoint: "no", every ``save_steps`` steps, or each epoch. None: "steps"
    if ``save_steps`` > 0, else "no". The final model is saved either way."""

    # ---- experiment tracking ----------------------------------------------------------------------------
    report_to: str | list[str] = "none"
    """Metric sinks besides metrics.jsonl: "tensorboard", "wandb", "trackio", "mlflow", a list of them,
    "all" (every one installed) or "none"."""
    run_name: str | None = None
    """Name of the run in W&B / trackio / MLflow; None: the output_dir's last component."""
    project: str = "grpokit"
    """Project (W&B, trackio) or experiment (MLflow) the run is logged under."""
    logging_dir: str | None = None
    """TensorBoard event directory; None: ``<output_dir>/tensorboard``."""
    logging_first_step: bool = False
    """Also log the first step when ``logging_steps`` would skip it."""

    # ---- the hub and the model card ---------------------------------------------------------------------
    push_to_hub: bool = False
    """Upload the saved model (with its model card) to the Hugging Face Hub with ``huggingface_hub``."""
    hub_model_id: str | None = None
    """Repository to push to, ``user/name``; None: the output_dir's last component under your account."""
    hub_strategy: Literal["end", "every_save"] = "every_save"
    """Push at the end only, or also each time a checkpoint is saved (the model, not the optimizer state)."""
    hub_token: str | None = None
    """Token for the push; None: the one ``huggingface-cli login`` stored (or ``HF_TOKEN``)."""
    hub_private_repo: bool | None = None
    """Create the repository private (None: the hub's default)."""
    hub_revision: str | None = None
    """Branch to push to (None: main)."""

    # ---- model loading, optimizer, generation (TRL names) ------------------------------------------------
    trust_remote_code: bool = False
    """Allow a model directory's own modelling code (``from_pretrained(trust_remote_code=True)``)."""
    optim: Literal["adamw_torch", "adamw_torch_fused"] = "adamw_torch_fused"
    """Optimizer: AdamW's fused kernel (the default, as TRL's: one pass per parameter, no temporaries; CUDA
    and CPU, the plain kernel elsewhere) or the plain ``adamw_torch`` (same update up to float rounding)."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon."""
    lr_scheduler_kwargs: dict[str, str | int | float | bool] | None = None
    """Extra arguments of the learning-rate schedule (``transformers.get_scheduler``'s
    ``scheduler_specific_kwargs``), e.g. ``{num_cycles: 0.5}`` for cosine."""
    data_seed: int | None = None
    """Seed of the training prompts' order (None: ``seed``)."""
    generation_kwargs: dict[str, str | int | float | bool] | None = None
    """Sampling settings that take precedence over the fields of the same meaning (TRL's name):
    ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty``, ``max_new_tokens`` (=
    max_completion_length). Other keys are refused: the fast sampler has no other knobs."""


SINKS = ("tensorboard", "wandb", "trackio", "mlflow")
"""Metric sinks ``report_to`` may name (besides "all" and "none")."""

_GENERATION_KWARGS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_completion_length",
}


def resolve_integration_fields(config: Any) -> None:
    """Turn TRL's shorthand forms into one meaning each, at construction: ``report_to`` as a list of sink
    names, ``generation_kwargs`` written into the sampling fields, and the eval/save strategies made
    explicit. Errors name the field."""
    from grpokit.config.validation import require

    config.report_to = _report_to_list(config.report_to)
    for name in ("chat_template_kwargs", "lr_scheduler_kwargs", "generation_kwargs"):
        values = getattr(config, name)
        if values:
            setattr(config, name, {key: typed_value(value) for key, value in values.items()})
    if config.gradient_checkpointing_kwargs:
        config.gradient_checkpointing_kwargs = {
            key: typed_value(value) for key, value in config.gradient_checkpointing_kwargs.items()
        }
    for key, value in (config.generation_kwargs or {}).items():
        require(
            key in _GENERATION_KWARGS,
            "generation_kwargs",
            f"key {key!r} is not supported: grpokit's sampler takes {sorted(_GENERATION_KWARGS)}",
        )
        setattr(config, _GENERATION_KWARGS[key], value)
    if config.eval_strategy is None:
        config.eval_strategy = "steps" if config.eval_steps else "no"
    if config.eval_strategy == "steps" and config.eval_steps is None:
        config.eval_steps = config.logging_steps
    if config.eval_strategy == "steps":
        require(config.eval_steps >= 1, "eval_steps", "must be >= 1 with eval_strategy='steps'")
    if config.save_strategy is None:
        config.save_strategy = "steps" if config.save_steps > 0 else "no"
    if config.save_strategy == "steps":
        require(config.save_steps >= 1, "save_steps", "must be >= 1 with save_strategy='steps'")
    require(config.per_device_eval_batch_size >= 1, "per_device_eval_batch_size", "must be >= 1")
    require(config.adam_epsilon > 0, "adam_epsilon", "must be > 0")
    require(config.prompt_column != "", "prompt_column", "must name a column")


def _report_to_list(report_to: str | list[str] | None) -> list[str]:
    from grpokit.config.validation import require

    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    names = [name.strip() for name in names if name.strip() not in ("none", "")]
    for name in names:
        require(
            name in (*SINKS, "all"),
            "report_to",
            f"names an unknown sink {name!r}; use {', '.join(SINKS)}, 'all' or 'none'",
        )
    return names


def typed_value(value: Any) -> Any:
    """A dict value from the command line typed as YAML (``false`` -> False, ``3`` -> 3, ``0.5`` -> 0.5):
    tyro reads the values of a ``dict[str, str | ...]`` as strings, and the string "false" is true in a
    Jinja chat template. Other strings, and non-strings, are returned unchanged."""
    if not isinstance(value, str):
        return value
    import yaml

    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    return parsed if isinstance(parsed, (bool, int, float)) else value
