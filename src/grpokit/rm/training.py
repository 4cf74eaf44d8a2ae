"""Reward-model training and scoring: outcome reward models and process reward models from labelled samples
(:mod:`grpokit.rm.samples`).

- ``kind="outcome"``: an ``AutoModelForSequenceClassification`` with ``num_labels=1``, read at the last
  token; loss: pointwise binary cross-entropy with logits on the labels (DeepSeekMath trains its RM on
  correctness labels).
- ``kind="process"``: an ``AutoModelForTokenClassification`` with ``num_labels=1``, read at the token ending
  each step (see ``grpokit.rewards.process_rewards.prm``); loss: binary cross-entropy with logits over all
  steps of the batch.

Input layout, shared with scoring: ``render_prompt(prompt)`` + ``completion_text(completion)``, each tokenized
on its own (``encode_prompt_completion``). Accuracy: a prediction is right when ``logit > 0`` agrees with
``label >= 0.5``; outcome accuracy is over samples, process accuracy over steps. ``grpokit train-rm`` wraps it
all (``grpokit.cli.train_rm``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from grpokit.core import pad_right
from grpokit.data.chat import completion_text, render_prompt
from grpokit.models.loading import pad_token_id
from grpokit.rewards.process_rewards.prm import encode_prompt_completion, scalar_logits
from grpokit.rewards.process_rewards.steps import DEFAULT_STEP_DELIMITER, token_char_ends
from grpokit.rm.losses import bradley_terry_loss, class_weights, pointwise_loss
from grpokit.rm.samples import check_kind, load_rm_samples

__all__ = [
    "classifier_pad_id",
    "evaluate_reward_model",
    "outcome_scores",
    "prefix_labels",
    "train_reward_model",
]


@dataclass
class _Batch:
    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    labels: torch.Tensor  # outcome: [B]; process: [S] (every step of the batch)
    rows: torch.Tensor  # process: [S] row of each step
    positions: torch.Tensor  # process: [S] position of each step's end token
    groups: torch.Tensor  # [B] or [S]: items that may be compared (same prompt; process: same step index)


def prefix_labels(tokenizer: Any, completion: str, reference: str) -> list[float]:
    """One label per token of ``completion`` (tokenized on its own, as for scoring): 1.0 while the
    completion up to and including that token is a prefix of ``reference`` (a right solution), 0.0 from
    the first token that leaves it on. Dense process labels: each token says whether the solution is still
    on track there."""
    ids = list(tokenizer(completion, add_special_tokens=False)["input_ids"]) if completion else []
    text = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    labels, on_track = [], True
    for end in token_char_ends(text, ids, tokenizer):
        on_track = on_track and reference.startswith(text[:end])
        labels.append(1.0 if on_track else 0.0)
    return labels


def _collate(
    tokenizer: Any,
    samples: Sequence[dict[str, Any]],
    kind: str,
    delimiter: str,
    max_length: int | None,
    pad: int,
    dense: bool = False,
) -> _Batch:
    sequences, labels, rows, positions, groups = [], [], [], [], []
    keys: dict[tuple[str, int], int] = {}
    for b, sample in enumerate(samples):
        prompt = render_prompt(sample["prompt"], tokenizer)
        text = completion_text(sample["completion"])
        ids, ends = encode_prompt_completion(
            tokenizer, prompt, text, delimiter if kind == "process" else None, max_length
        )
        sequences.append(ids)
        if kind == "outcome":
            labels.append(float(sample["label"]))
            groups.append(keys.setdefault((prompt, 0), len(keys)))
        elif dense:  # a label at every completion token still in the (left-cut) sequence
            token_labels = prefix_labels(tokenizer, text, sample["reference"])
            start = len(ids) - len(token_labels)  # the completion's first position
            kept = [i for i in range(len(token_labels)) if start + i >= 0]
            labels.extend(token_labels[i] for i in kept)
            rows.extend([b] * len(kept))
            positions.extend(start + i for i in kept)
            groups.extend(keys.setdefault((prompt, i), len(keys)) for i in kept)
        else:
            labels.extend(float(v) for v in sample["step_labels"])
            rows.extend([b] * len(ends))
            positions.extend(ends)
            groups.extend(keys.setdefault((prompt, j), len(keys)) for j in range(len(ends)))
    input_ids, attention_mask = pad_right(sequences, pad)
    return _Batch(
        input_ids,
        attention_mask,
        torch.tensor(labels, dtype=torch.float32),
        torch.tensor(rows, dtype=torch.long),
        torch.tensor(positions, dtype=torch.long),
        torch.tensor(groups, dtype=torch.long),
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


def classifier_pad_id(model: torch.nn.Module, tokenizer: Any) -> int:
    """The pad id to use. A sequence classifier reads each row at its rightmost token that is not
    ``config.pad_token_id``, so padding must use exactly that id: the config's when set, else the
    tokenizer's (written into the config)."""
    pad = getattr(model.config, "pad_token_id", None)
    if not isinstance(pad, int):
        pad = pad_token_id(tokenizer, model)
        model.config.pad_token_id = pad
    return pad


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
    """``{"loss", "accuracy", "count", "positive_fraction", "constant_accuracy"}``: mean BCE and accuracy
    over samples (outcome) or steps (process); the fraction labelled positive (>= 0.5) and the trivial
    baseline, the accuracy of always answering the majority class (``max(p, 1 - p)``), which a useful reward
    model must beat. An empty dataset (or one without steps) gives NaN for all but ``count``."""
    check_kind(kind)
    samples = load_rm_samples(dataset, kind, delimiter=delimiter)
    pad = classifier_pad_id(model, tokenizer)
    was_training = model.training
    model.eval()
    total_loss, correct, count, positive = 0.0, 0, 0, 0
    try:
        for start in range(0, len(samples), batch_size):
            batch = _collate(tokenizer, samples[start : start + batch_size], kind, delimiter, max_length, pad)
            if batch.labels.numel() == 0:
                continue
            logits, labels = _logits(model, batch, kind)
            total_loss += float(F.binary_cross_entropy_with_logits(logits, labels, reduction="sum"))
            correct += int(((logits > 0) == (labels >= 0.5)).sum())
            positive += int((labels >= 0.5).sum())
            count += labels.numel()
    finally:
        model.train(was_training)
    if count == 0:
        nan = math.nan
        return {"loss": nan, "accuracy": nan, "count": 0, "positive_fraction": nan, "constant_accuracy": nan}
    p = positive / count
    return {
        "loss": total_loss / count,
        "accuracy": correct / count,
        "count": count,
        "positive_fraction": p,
        "constant_accuracy": max(p, 1.0 - p),
    }


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
    class_balance: bool = False,
    pairwise_weight: float = 0.0,
    dense_labels: bool = False,
    optimizer: torch.optim.Optimizer | None = None,
    eval_dataset: Any | None = None,
    log_fn: Callable[[dict[str, float]], None] | None = None,
) -> dict[str, float]:
    """Train ``model`` in place on labelled samples; returns metrics.

    One optimizer step per batch of ``batch_size`` samples; samples are shuffled each epoch with
    ``random.Random(seed + epoch)`` (with ``pairwise_weight > 0``, whole groups of samples sharing a prompt
    are shuffled and kept together, so that batches hold pairs to compare). The loss of a batch is the mean
    BCE-with-logits over its samples (outcome) or over all its steps (process) (:mod:`grpokit.rm.losses`);
    ``class_balance``: each item weighted by its class's weight over the whole training set, so both classes
    weigh the same; plus ``pairwise_weight`` x the Bradley-Terry loss over the batch's pairs of the same
    prompt (and step index) with different labels. ``dense_labels`` (process models): instead of one label
    per step, one per completion token, :func:`prefix_labels` against each row's ``reference`` (a right
    solution): the token where a solution goes wrong is itself labelled, not only the end of its step.
    ``optimizer`` (e.g. kept across iterative updates)
    defaults to a fresh AdamW(lr, weight_decay). ``log_fn`` receives ``{"epoch", "loss"}`` after each epoch.

    Returns ``{"train_loss"`` (mean over the last epoch), ``"optimizer_steps", "num_samples", "epochs"}``,
    plus ``eval_loss``/``eval_accuracy`` when ``eval_dataset`` is given.
    """
    check_kind(kind)
    if epochs < 0 or batch_size < 1:
        raise ValueError(f"need epochs >= 0 and batch_size >= 1, got {epochs}, {batch_size}")
    if not (math.isfinite(pairwise_weight) and pairwise_weight >= 0):
        raise ValueError(f"pairwise_weight must be a finite number >= 0, got {pairwise_weight}")
    samples = load_rm_samples(dataset, kind, delimiter=delimiter)
    if dense_labels:
        if kind != "process":
            raise ValueError("dense_labels: per-token labels train process reward models, not outcome ones")
        missing = next((i for i, sample in enumerate(samples) if "reference" not in sample), None)
        if missing is not None:
            raise ValueError(
                f"dense_labels: row {missing} has no 'reference' field (a right solution to label the "
                "tokens against)"
            )
    weights = class_weights(_all_labels(samples, kind)) if class_balance else (1.0, 1.0)
    pad = classifier_pad_id(model, tokenizer)
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
        order = _epoch_order(samples, random.Random(seed + epoch), grouped=pairwise_weight > 0)
        losses, counts = [], []
        for start in range(0, len(order), batch_size):
            chunk = [samples[i] for i in order[start : start + batch_size]]
            batch = _collate(tokenizer, chunk, kind, delimiter, max_length, pad, dense_labels)
            if batch.labels.numel() == 0:
                continue
            logits, labels = _logits(model, batch, kind)
            loss = pointwise_loss(logits, labels, weights)
            if pairwise_weight > 0:
                pairwise = bradley_terry_loss(logits, labels, batch.groups.to(logits.device))
                loss = loss if pairwise is None else loss + pairwise_weight * pairwise
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if max_grad_norm and max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            steps += 1
            losses.append(float(loss.detach()) * labels.numel())
            counts.append(labels.numel())
        epoch_loss = sum(losses) / sum(counts) if counts else math.nan
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


def _all_labels(samples: Sequence[dict[str, Any]], kind: str) -> torch.Tensor:
    """Every label of the training set: one per sample (outcome) or per step (process)."""
    if kind == "outcome":
        return torch.tensor([float(s["label"]) for s in samples])
    return torch.tensor([float(v) for s in samples for v in s["step_labels"]])


def _epoch_order(samples: Sequence[dict[str, Any]], rng: random.Random, *, grouped: bool) -> list[int]:
    """One epoch's sample order: a shuffle of all samples, or (``grouped``) of the groups of samples with
    the same prompt, each group kept together in its original order."""
    if not grouped:
        order = list(range(len(samples)))
        rng.shuffle(order)
        return order
    groups: dict[str, list[int]] = {}
    for i, sample in enumerate(samples):
        groups.setdefault(repr(sample["prompt"]), []).append(i)
    blocks = list(groups.values())
    rng.shuffle(blocks)
    return [i for block in blocks for i in block]


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
    pad = classifier_pad_id(model, tokenizer)
    model.eval()
    out: list[float] = []
    for start in range(0, len(completions), batch_size):
        seqs = [
            encode_prompt_completion(
                tokenizer, render_prompt(p, tokenizer), completion_text(c), None, max_length
            )[0]
            for p, c in zip(prompts[start : start + batch_size], completions[start : start + batch_size])
        ]
        ids, mask = pad_right(seqs, pad)
        logits = model(input_ids=ids.to(_device(model)), attention_mask=mask.to(_device(model))).logits
        values = scalar_logits(logits.float())
        values = torch.sigmoid(values) if output == "prob" else values
        out.extend(float(v) for v in values.cpu())
    return out
