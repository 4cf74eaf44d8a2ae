"""Datasets in, validated prompt rows out.

A training dataset is a ``datasets.Dataset``, a list of dicts, or a local json/jsonl/csv/parquet file. Each
row needs a ``prompt``: a string (standard format) or a list of ``{"role", "content"}`` messages
(conversational format, rendered with the tokenizer's chat template: ``grpokit.chat``). Every other
column is forwarded to the reward functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grpokit.records import read_jsonl

__all__ = ["load_rows", "reward_columns", "validate_rows"]

_FILE_LOADERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def load_rows(source: Any, *, name: str = "train_dataset") -> list[dict[str, Any]]:
    """Materialise ``source`` (Dataset, list of dicts, or file path) as a validated list of row dicts."""
    if source is None:
        raise ValueError(f"{name} is required")
    if isinstance(source, (str, Path)):
        rows = _load_file(Path(source), name)
    elif isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
        rows = [dict(row) if isinstance(row, dict) else row for row in source]
    elif hasattr(source, "to_list"):  # datasets.Dataset
        rows = source.to_list()
    else:
        raise TypeError(
            f"{name}: expected a datasets.Dataset, a list of dicts or a file path, got {type(source)}"
        )
    validate_rows(rows, name)
    return rows


def _load_file(path: Path, name: str) -> list[dict[str, Any]]:
    if not path.exists():
        raise FileNotFoundError(f"{name}: no such file {path}")
    kind = _FILE_LOADERS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(f"{name}: unsupported file type {path.suffix!r}; use one of {sorted(_FILE_LOADERS)}")
    if path.suffix.lower() == ".jsonl":
        return read_jsonl(path, name)
    import datasets

    return datasets.load_dataset(kind, data_files=str(path), split="train").to_list()


def validate_rows(rows: list[Any], name: str) -> None:
    """Every row is a dict with a usable ``prompt``; errors name the row and the field."""
    if len(rows) == 0:
        raise ValueError(f"{name} is empty")
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{name} row {index}: expected a dict, got {type(row).__name__}")
        if "prompt" not in row:
            raise ValueError(f"{name} row {index}: missing the 'prompt' field (columns: {sorted(row)})")
        _validate_prompt(row["prompt"], f"{name} row {index} field 'prompt'")


def _validate_prompt(prompt: Any, where: str) -> None:
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError(f"{where}: empty string")
        return
    if not isinstance(prompt, list) or not prompt:
        raise ValueError(
            f"{where}: expected a string or a non-empty list of messages, got {type(prompt).__name__}"
        )
    for turn, message in enumerate(prompt):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ValueError(f"{where}: message {turn} must be a dict with 'role' and 'content'")


def reward_columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Columns other than ``prompt``, one list per column (rows missing a key get None)."""
    keys = sorted({key for row in rows for key in row if key != "prompt"})
    return {key: [row.get(key) for row in rows] for key in keys}
