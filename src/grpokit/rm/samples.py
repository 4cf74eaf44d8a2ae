"""Labelled reward-model samples: what they look like, checked row by row, from lists, data sets or files.

One row per sample:

- ``kind="outcome"``: ``{"prompt", "completion", "label"}``, label in [0, 1] (1 = correct);
- ``kind="process"``: ``{"prompt", "completion", "step_labels"}``, one label in [0, 1] per step of the
  completion (``split_steps(completion, delimiter)``; empty steps do not count).

Optional: ``"reference"``, a right solution (a string), for dense per-token process labels
(``train_reward_model(dense_labels=True)``).

Prompts are strings or chat messages; completions strings or assistant messages. Errors name the data set,
the row and the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from grpokit.data.chat import completion_text, is_conversational
from grpokit.data.records import read_jsonl
from grpokit.rewards.process_rewards.steps import DEFAULT_STEP_DELIMITER, split_steps

__all__ = ["RM_KINDS", "RMKind", "check_kind", "load_rm_samples", "validate_rm_samples"]

RMKind = Literal["outcome", "process"]
RM_KINDS = ("outcome", "process")


def check_kind(kind: str) -> None:
    """ValueError unless ``kind`` is "outcome" or "process"."""
    if kind not in RM_KINDS:
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
    check_kind(kind)
    out: list[dict[str, Any]] = []
    for index, row in enumerate(rows):
        where = f"{name} row {index}"
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a dict, got {type(row).__name__}")
        for key in ("prompt", "completion", "label" if kind == "outcome" else "step_labels"):
            if key not in row:
                raise ValueError(f"{where}: missing the {key!r} field (columns: {sorted(row)})")
        prompt = row["prompt"]
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and is_conversational(prompt))):
            raise ValueError(f"{where} field 'prompt': expected a string or a list of chat messages")
        completion = row["completion"]
        if not (
            isinstance(completion, str) or (isinstance(completion, list) and is_conversational(completion))
        ):
            raise ValueError(f"{where} field 'completion': expected a string or chat messages")
        if "reference" in row and not isinstance(row["reference"], str):
            raise ValueError(f"{where} field 'reference': expected a string (a right solution)")
        if kind == "outcome":
            if not _is_label(row["label"]):
                raise ValueError(f"{where} field 'label': expected a number in [0, 1], got {row['label']!r}")
        else:
            _check_step_labels(where, row["step_labels"], completion_text(completion), delimiter)
        out.append(dict(row))
    return out


def _check_step_labels(where: str, labels: Any, completion: str, delimiter: str) -> None:
    if not isinstance(labels, (list, tuple)):
        raise ValueError(f"{where} field 'step_labels': expected a list, got {type(labels).__name__}")
    for j, value in enumerate(labels):
        if not _is_label(value):
            raise ValueError(f"{where} field 'step_labels'[{j}]: expected a number in [0, 1], got {value!r}")
    num_steps = len(split_steps(completion, delimiter))
    if len(labels) != num_steps:
        raise ValueError(
            f"{where} field 'step_labels': {len(labels)} labels but the completion has {num_steps} "
            f"steps (delimiter {delimiter!r}; empty steps do not count)"
        )


def load_rm_samples(
    source: Any, kind: str, *, delimiter: str = DEFAULT_STEP_DELIMITER, name: str = "dataset"
) -> list[dict[str, Any]]:
    """Rows from a list of dicts, a ``datasets.Dataset`` or a .json/.jsonl file, validated."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"{name}: no such file {path}")
        if path.suffix == ".jsonl":
            rows = read_jsonl(path, name)
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
