"""Reward-model training: outcome reward models and process reward models from labelled samples.

Labelled data (a list of dicts, a ``datasets.Dataset``, or a json/jsonl file), one row per sample:

- ``kind="outcome"``: ``{"prompt", "completion", "label"}``, label in [0, 1] (1 = correct). The model is an
  ``AutoModelForSequenceClassification`` with ``num_labels=1``, read at the last token; loss: pointwise
  binary cross-entropy with logits on the labels (DeepSeekMath trains its RM on correctness labels).
- ``kind="process"``: ``{"prompt", "completion", "step_labels"}``, one label in [0, 1] per step of the
  completion (``split_steps(completion, delimiter)``). The model is an ``AutoModelForTokenClassification``
  with ``num_labels=1``, read at the token ending each step (see ``grpokit.rewards.process.prm``); loss:
  binary cross-entropy with logits over all steps of the batch.

Prompts may be strings or chat messages (rendered with the tokenizer's chat template); completions strings
or assistant messages. Accuracy: a prediction is right when ``logit > 0`` agrees with ``label >= 0.5``;
outcome accuracy is over samples, process accuracy over steps. ``grpokit train-rm`` (``train_rm_main``)
wraps it all and saves a standard ``transformers`` checkpoint (model + tokenizer).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

from grpokit.rewards.process.prm import (
    encode_prompt_completion,
    load_tokenizer,
    pad_batch,
    pad_token_id,
    prompt_text,
    scalar_logits,
)
from grpokit.rewards.process.steps import DEFAULT_STEP_DELIMITER, completion_text, split_steps

__all__ = [
    "RMKind",
    "build_tiny_reward_model",
    "evaluate_reward_model",
    "load_reward_model",
    "load_rm_samples",
    "outcome_scores",
    "save_reward_model",
    "train_reward_model",
    "validate_rm_samples",
]

RMKind = Literal["outcome", "process"]
_KINDS = ("outcome", "process")


# ---------------------------------------------------------------------------------------------------------
# data


def _check_kind(kind: str) -> None:
    if kind not in _KINDS:
        raise ValueError(f"kind must be 'outcome' or 'process', got {kind!r}")


def _is_label(value: Any) -> bool:
    """A label is a bool or a finite number in [0, 1]."""
    if isinstance(value, bool):
        return True
    return isinstance(value, (int, float)) and math.isfinite(value) and 0.0 <= value <= 1.0


def validate_rm_samples(
    rows: Sequence[Any], kind: str, *, delimiter: str = DEFAULT_STEP_DELIMITER, name: str = "dataset"
) -> list[dict[str, Any]]:
    """Check every row; errors name the dataset, the row and the field. Returns the rows as dicts."""
    _check_kind(kind)
    out: list[dict[str, Any]] = []
    for index, row in enumerate(rows):
        where = f"{name} row {index}"
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a dict, got {type(row).__name__}")
        for key in ("prompt", "completion", "label" if kind == "outcome" else "step_labels"):
            if key not in row:
                raise ValueError(f"{where}: missing the {key!r} field (columns: {sorted(row)})")
        prompt = row["prompt"]
        if not (
            isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt))
        ):
            raise ValueError(f"{where} field 'prompt': expected a string or a list of chat messages")
        completion = row["completion"]
        if not isinstance(completion, (str, list)):
            raise ValueError(f"{where} field 'completion': expected a string or chat messages")
        if kind == "outcome":
            if not _is_label(row["label"]):
                raise ValueError(f"{where} field 'label': expected a number in [0, 1], got {row['label']!r}")
        else:
            labels = row["step_labels"]
            if not isinstance(labels, (list, tuple)):
                raise ValueError(f"{where} field 'step_labels': expected a list, got {type(labels).__name__}")
            for j, value in enumerate(labels):
                if not _is_label(value):
                    raise ValueError(
                        f"{where} field 'step_labels'[{j}]: expected a number in [0, 1], got {value!r}"
                    )
            num_steps = len(split_steps(completion_text(completion), delimiter))
            if len(labels) != num_steps:
                raise ValueError(
                    f"{where} field 'step_labels': {len(labels)} labels but the completion has {num_steps} "
                    f"steps (delimiter {delimiter!r}; empty steps do not count)"
                )
        out.append(dict(row))
    return out


def load_rm_samples(
    source: Any, kind: str, *, delimiter: str = DEFAULT_STEP_DELIMITER, name: str = "dataset"
) -> list[dict[str, Any]]:
    """Rows from a list of dicts, a ``datasets.Dataset`` or a .json/.jsonl file, validated."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"{name}: no such file {path}")
        if path.suffix == ".jsonl":
            rows = []
            for line_no, line in enumerate(path.read_text().splitlines(), start=1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as err:
                        raise ValueError(
                            f"{name}: {path} line {line_no} is not valid JSON: {err.msg}"
                        ) from err
        elif path.suffix == ".json":
            rows = json.loads(path.read_text())
            if not isinstance(rows, list):
                raise ValueError(f"{name}: {path} must hold a JSON list of rows")
        else:
            raise ValueError(f"{name}: unsupported file type {path.suffix!r}; use .json or .jsonl")
    elif hasattr(source, "to_list"):
        rows = source.to_list()
    else:
        rows = list(source)
    return validate_rm_samples(rows, kind, delimiter=delimiter, name=name)


@dataclass
class _Batch:
    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    labels: torch.Tensor  # outcome: [B]; process: [S] (every step of the batch)
    rows: torch.Tensor  # process: [S] row of each step
    positions: torch.Tensor  # process: [S] position of each step's end token


def _collate(
    tokenizer: Any,
    samples: Sequence[dict[str, Any]],
    kind: str,
    delimiter: str,
    max_length: int | None,
    pad: int,
) -> _Batch:
    sequences, labels, rows, positions = [], [], [], []
    for b, sample in enumerate(samples):
        ids, ends = encode_prompt_completion(
            tokenizer,
            prompt_text(sample["prompt"], tokenizer),
            completion_text(sample["completion"]),
            delimiter if kind == "process" else None,
            max_length,
        )
        sequences.append(ids)
        if kind == "outcome":
            labels.append(float(sample["label"]))
        else:
            labels.extend(float(v) for v in sample["step_labels"])
            rows.extend([b] * len(ends))
            positions.extend(ends)
    input_ids, attention_mask = pad_batch(sequences, pad)
    return _Batch(
        input_ids,
        attention_mask,
        torch.tensor(labels, dtype=torch.float32),
        torch.tensor(rows, dtype=torch.long),
        torch.tensor(positions, dtype=torch.long),
    )


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _logits(model: torch.nn.Module, batch: _Batch, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(scalar logits, labels) of the batch's items: outcome [B]; process [S]."""
    device = _device(model)
    out = model(input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device)).logits
    if kind == "outcome":
        if out.dim() != 2:
            raise ValueError(
                f"an outcome reward model must give one score per sequence (logits [B, 1]), got shape "
                f"{tuple(out.shape)}; use AutoModelForSequenceClassification with num_labels=1"
            )
        logits = scalar_logits(out.float())  # [B]
    else:
        if out.dim() != 3:
            raise ValueError(
                f"a process reward model must give one score per token (logits [B, L, 1]), got shape "
                f"{tuple(out.shape)}; use AutoModelForTokenClassification with num_labels=1"
            )
        logits = scalar_logits(out.float())[batch.rows.to(device), batch.positions.to(device)]  # [S]
    return logits, batch.labels.to(device)


def _prepare(model: torch.nn.Module, tokenizer: Any) -> int:
    """The pad id to use. A sequence classifier reads each row at its rightmost token that is not
    ``config.pad_token_id``, so padding must use exactly that id: the config's when set, else the
    tokenizer's (written into the config)."""
    pad = getattr(model.config, "pad_token_id", None)
    if not isinstance(pad, int):
        pad = pad_token_id(tokenizer, model)
        model.config.pad_token_id = pad
    return pad


# ---------------------------------------------------------------------------------------------------------
# train / evaluate


@torch.no_grad()
def evaluate_reward_model(
    model: torch.nn.Module,
    tokenizer: Any,
    dataset: Any,
    *,
    kind: str = "outcome",
    batch_size: int = 16,
    delimiter: str = DEFAULT_STEP_DELIMITER,
    max_length: int | None = None,
) -> dict[str, float]:
    """``{"loss", "accuracy", "count"}``: mean BCE and accuracy over samples (outcome) or steps (process).
    An empty dataset (or one without steps) gives NaN loss and accuracy."""
    _check_kind(kind)
    samples = load_rm_samples(dataset, kind, delimiter=delimiter)
    pad = _prepare(model, tokenizer)
    was_training = model.training
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    try:
        for start in range(0, len(samples), batch_size):
            batch = _collate(tokenizer, samples[start : start + batch_size], kind, delimiter, max_length, pad)
            if batch.labels.numel() == 0:
                continue
            logits, labels = _logits(model, batch, kind)
            total_loss += float(F.binary_cross_entropy_with_logits(logits, labels, reduction="sum"))
            correct += int(((logits > 0) == (labels >= 0.5)).sum())
            count += labels.numel()
    finally:
        model.train(was_training)
    if count == 0:
        return {"loss": math.nan, "accuracy": math.nan, "count": 0}
    return {"loss": total_loss / count, "accuracy": correct / count, "count": count}


def train_reward_model(
    model: torch.nn.Module,
    tokenizer: Any,
    dataset: Any,
    *,
    kind: str = "outcome",
    epochs: int = 1,
    lr: float = 1e-4,
    batch_size: int = 16,
    delimiter: str = DEFAULT_STEP_DELIMITER,
    max_length: int | None = None,
    weight_decay: float = 0.0,
    max_grad_norm: float = 1.0,
    seed: int = 0,
    optimizer: torch.optim.Optimizer | None = None,
    eval_dataset: Any | None = None,
    log_fn: Callable[[dict[str, float]], None] | None = None,
) -> dict[str, float]:
    """Train ``model`` in place on labelled samples; returns metrics.

    One optimizer step per batch of ``batch_size`` samples; samples are shuffled each epoch with
    ``random.Random(seed + epoch)``. The loss of a batch is the mean BCE-with-logits over its samples
    (outcome) or over all its steps (process). ``optimizer`` (e.g. kept across iterative updates) defaults to
    a fresh AdamW(lr, weight_decay). ``log_fn`` receives ``{"epoch", "loss"}`` after each epoch.

    Returns ``{"train_loss"`` (mean over the last epoch), ``"optimizer_steps", "num_samples", "epochs"}``,
    plus ``eval_loss``/``eval_accuracy`` when ``eval_dataset`` is given.
    """
    _check_kind(kind)
    if epochs < 0 or batch_size < 1:
        raise ValueError(f"need epochs >= 0 and batch_size >= 1, got {epochs}, {batch_size}")
    samples = load_rm_samples(dataset, kind, delimiter=delimiter)
    pad = _prepare(model, tokenizer)
    if optimizer is None:
        trainable = [p for p in model.parameters() if p.requires_grad]
        if not trainable:
            raise ValueError(
                "the reward model has no trainable parameters (ProcessRewardModel freezes its module); "
                "call model.requires_grad_(True) first"
            )
        optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay)
    model.train()
    steps, epoch_loss = 0, math.nan
    for epoch in range(epochs):
        order = list(range(len(samples)))
        random.Random(seed + epoch).shuffle(order)
        losses, weights = [], []
        for start in range(0, len(order), batch_size):
            chunk = [samples[i] for i in order[start : start + batch_size]]
            batch = _collate(tokenizer, chunk, kind, delimiter, max_length, pad)
            if batch.labels.numel() == 0:
                continue
            logits, labels = _logits(model, batch, kind)
            loss = F.binary_cross_entropy_with_logits(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if max_grad_norm and max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            steps += 1
            losses.append(float(loss.detach()) * labels.numel())
            weights.append(labels.numel())
        epoch_loss = sum(losses) / sum(weights) if weights else math.nan
        if log_fn is not None:
            log_fn({"epoch": epoch + 1, "loss": epoch_loss})
    model.eval()
    metrics: dict[str, float] = {
        "train_loss": epoch_loss,
        "optimizer_steps": steps,
        "num_samples": len(samples),
        "epochs": epochs,
    }
    if eval_dataset is not None:
        result = evaluate_reward_model(
            model,
            tokenizer,
            eval_dataset,
            kind=kind,
            batch_size=batch_size,
            delimiter=delimiter,
            max_length=max_length,
        )
        metrics["eval_loss"], metrics["eval_accuracy"] = result["loss"], result["accuracy"]
    return metrics


@torch.no_grad()
def outcome_scores(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[Any],
    completions: Sequence[Any],
    *,
    batch_size: int = 16,
    max_length: int | None = None,
    output: str = "prob",
) -> list[float]:
    """Scores of an outcome reward model, with the same input layout as training: sigmoid of the logit
    (``output="logit"``: the raw logit) at the last token of prompt + completion."""
    pad = _prepare(model, tokenizer)
    model.eval()
    out: list[float] = []
    for start in range(0, len(completions), batch_size):
        seqs = [
            encode_prompt_completion(
                tokenizer, prompt_text(p, tokenizer), completion_text(c), None, max_length
            )[0]
            for p, c in zip(prompts[start : start + batch_size], completions[start : start + batch_size])
        ]
        ids, mask = pad_batch(seqs, pad)
        logits = model(input_ids=ids.to(_device(model)), attention_mask=mask.to(_device(model))).logits
        values = scalar_logits(logits.float())
        values = torch.sigmoid(values) if output == "prob" else values
        out.extend(float(v) for v in values.cpu())
    return out


# ---------------------------------------------------------------------------------------------------------
# models and checkpoints


def _model_class(kind: str):
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    return AutoModelForSequenceClassification if kind == "outcome" else AutoModelForTokenClassification


def build_tiny_reward_model(
    tokenizer: Any,
    kind: str = "process",
    *,
    arch: str = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    max_position_embeddings: int = 256,
    seed: int = 0,
) -> torch.nn.Module:
    """A randomly initialised tiny reward model (the backbone config of ``grpokit.models.tiny``) with a
    one-logit head: sequence classification (outcome) or token classification (process)."""
    _check_kind(kind)
    from grpokit.models.tiny import build_tiny_model

    config = build_tiny_model(
        tokenizer,
        arch=arch,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        seed=seed,
    ).config
    config.num_labels = 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _model_class(kind).from_config(config, dtype=torch.float32)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model


def load_reward_model(path: str, kind: str) -> tuple[torch.nn.Module, Any]:
    """(model, tokenizer) from a directory. A checkpoint that already has the right head is loaded as is; any
    other (e.g. a causal LM policy) gets a new one-logit head on its backbone."""
    _check_kind(kind)
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    suffix = "ForSequenceClassification" if kind == "outcome" else "ForTokenClassification"
    has_head = any(a.endswith(suffix) for a in (getattr(config, "architectures", None) or []))
    if has_head:
        model = _model_class(kind).from_pretrained(path)
    else:
        model = _model_class(kind).from_pretrained(path, num_labels=1)
    tokenizer = load_tokenizer(path)
    _prepare(model, tokenizer)
    return model, tokenizer


def save_reward_model(
    model: torch.nn.Module,
    tokenizer: Any,
    output_dir: str | Path,
    *,
    kind: str,
    delimiter: str = DEFAULT_STEP_DELIMITER,
) -> Path:
    """Save a standard ``transformers`` checkpoint (model + tokenizer). The config also records
    ``grpokit_reward_kind`` and, for process models, ``step_delimiter`` (read by ``ProcessRewardModel``)."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.config.grpokit_reward_kind = kind
    if kind == "process":
        model.config.step_delimiter = delimiter
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# ---------------------------------------------------------------------------------------------------------
# CLI: grpokit train-rm
