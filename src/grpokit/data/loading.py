"""Data sets in, validated prompt rows out (docs/data.md).

``train_dataset`` / ``eval_dataset`` is a ``datasets.Dataset`` or ``DatasetDict``, a list of dicts, a local
json/jsonl/csv/parquet file or folder of data files, or a name that ``datasets.load_dataset`` resolves
(``grpokit.data.sources``). Then, in this order: ``column_mapping`` renames columns, ``prompt_column`` names
the column that becomes the row's ``prompt``, and every row is checked. A prompt is a string (standard
format) or a list of ``{"role", "content"}`` messages (conversational format, rendered with the tokenizer's
chat template: ``grpokit.data.chat``). Every other column is forwarded to the reward functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from grpokit.data.chat import message_content
from grpokit.data.integrity import InputError
from grpokit.data.sources import source_rows

__all__ = [
    "DataSettings",
    "apply_columns",
    "load_dataset_rows",
    "load_rows",
    "reward_columns",
    "validate_rows",
]


@dataclass(frozen=True)
class DataSettings:
    """What shapes the loaded rows: which configuration and split of a data set name, folder or
    ``DatasetDict`` (``grpokit train``'s options, TRL ScriptArguments' names), and the columns
    (``GRPOConfig.data_settings()`` gives a run's)."""

    dataset_config: str | None = None
    dataset_train_split: str = "train"
    dataset_test_split: str = "test"
    prompt_column: str = "prompt"
    column_mapping: Mapping[str, str] | None = None


def load_dataset_rows(
    source: Any,
    settings: DataSettings | None,
    *,
    name: str = "train_dataset",
    missing_prompt: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The validated rows of ``source`` under ``settings`` (None: the defaults).

    ``name`` is the argument's name in messages; ``"eval_dataset"`` takes ``settings.dataset_test_split`` of
    a ``DatasetDict``, folder or hub name, anything else ``settings.dataset_train_split``. ``dataset_config``
    goes to ``datasets.load_dataset``; ``column_mapping`` ({source: target}) renames columns first, then the
    ``prompt_column`` becomes each row's ``"prompt"``. Raises ValueError naming the field, the row and the
    columns for anything unusable (FileNotFoundError for a missing local path, TypeError for an object
    that is no data set).

    ``missing_prompt`` (TRL's ``environment_factory``, whose ``reset`` writes the prompts): a row without
    a prompt gets a copy of these messages, and a prompt whose messages are all empty is accepted.
    """
    settings = settings or DataSettings()
    split = settings.dataset_test_split if name == "eval_dataset" else settings.dataset_train_split
    rows = source_rows(source, split=split, dataset_config=settings.dataset_config, name=name)
    if len(rows) == 0:
        raise InputError(f"{name} is empty")
    rows = apply_columns(rows, settings.column_mapping, settings.prompt_column, name)
    if missing_prompt is not None:
        default = [dict(message) for message in missing_prompt]
        rows = [
            row if not isinstance(row, dict) or "prompt" in row else {**row, "prompt": default}
            for row in rows
        ]
    validate_rows(rows, name, blank_prompts=missing_prompt is not None)
    return rows


def load_rows(source: Any, *, name: str = "train_dataset") -> list[dict[str, Any]]:
    """``load_dataset_rows`` with the default settings: the ``train`` split (``test`` for
    ``eval_dataset``), no configuration, no renames, the prompt in the ``prompt`` column."""
    return load_dataset_rows(source, None, name=name)


def apply_columns(
    rows: list[Any], column_mapping: Mapping[str, str] | None, prompt_column: str, name: str
) -> list[Any]:
    """Rows with ``column_mapping``'s renames applied, then ``prompt_column`` renamed to ``"prompt"``
    (moved, not copied: reward functions receive the prompt as ``prompts``). Rows that are not dicts are
    passed through for ``validate_rows`` to report."""
    mapping = dict(column_mapping or {})
    if not mapping and prompt_column == "prompt":
        return rows
    columns = _columns(rows)
    _check_mapping(mapping, columns, name)
    renames = {column: mapping.get(column, column) for column in columns}
    if prompt_column != "prompt":
        renamed = list(renames.values())
        if prompt_column not in renamed:
            raise InputError(
                f"prompt_column={prompt_column!r}: {name} has no such column (columns"
                f"{' after column_mapping' if mapping else ''}: {renamed})"
            )
        if "prompt" in renamed:
            raise InputError(
                f"prompt_column={prompt_column!r}, but {name} also has a 'prompt' column; rename that one "
                "with column_mapping, e.g. {'prompt': 'original_prompt'}"
            )
        renames = {column: "prompt" if new == prompt_column else new for column, new in renames.items()}
    out: list[Any] = []
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            out.append(row)
            continue
        new = {renames[key]: value for key, value in row.items()}
        if prompt_column != "prompt" and "prompt" not in new:
            raise InputError(
                f"{name} row {index}: missing the prompt column {prompt_column!r} (prompt_column; "
                f"columns: {sorted(row)})"
            )
        out.append(new)
    return out


def _columns(rows: list[Any]) -> list[str]:
    """Every key of every dict row, in order of first appearance."""
    seen: dict[str, None] = {}
    for row in rows:
        if isinstance(row, dict):
            seen.update(dict.fromkeys(row))
    return list(seen)


def _check_mapping(mapping: dict[str, str], columns: list[str], name: str) -> None:
    for source, target in mapping.items():
        if source not in columns:
            raise InputError(
                f"column_mapping: {name} has no column {source!r} to rename (columns: {columns})"
            )
        if not isinstance(target, str) or not target:
            raise InputError(f"column_mapping: the new name of {source!r} must be a non-empty string")
    targets: dict[str, str] = {}
    for source, target in mapping.items():
        if target in targets:
            raise InputError(f"column_mapping renames both {targets[target]!r} and {source!r} to {target!r}")
        targets[target] = source
        if target in columns and target not in mapping:
            raise InputError(
                f"column_mapping renames {source!r} to {target!r}, but {name} already has a {target!r} "
                f"column; rename that one too (columns: {columns})"
            )


def validate_rows(rows: list[Any], name: str, *, blank_prompts: bool = False) -> None:
    """Every row is a dict with a usable ``prompt``; errors name the row and the field. ``blank_prompts``:
    a list of messages whose contents are all empty passes (an environment's ``reset`` writes it)."""
    if len(rows) == 0:
        raise InputError(f"{name} is empty")
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise InputError(f"{name} row {index}: expected a dict, got {type(row).__name__}")
        if "prompt" not in row:
            raise InputError(f"{name} row {index}: missing the 'prompt' field (columns: {sorted(row)})")
        _validate_prompt(row["prompt"], f"{name} row {index} field 'prompt'", blank_prompts)


def _validate_prompt(prompt: Any, where: str, blank: bool = False) -> None:
    """A non-blank string, or a non-empty list of messages with some text."""
    if prompt is None:
        raise InputError(f"{where}: empty (None)")
    if isinstance(prompt, str):
        if not prompt.strip():
            raise InputError(f"{where}: {'empty string' if not prompt else 'whitespace-only string'}")
        return
    if not isinstance(prompt, list):
        raise InputError(
            f"{where}: expected a string or a list of {{'role', 'content'}} messages, got "
            f"{type(prompt).__name__}"
        )
    if not prompt:
        raise InputError(f"{where}: empty list of messages")
    for turn, message in enumerate(prompt):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise InputError(f"{where}: message {turn} must be a dict with 'role' and 'content'")
        content = message["content"]
        if isinstance(content, list) and not content:
            raise InputError(f"{where}: message {turn} has an empty content list")
        if not isinstance(content, (str, list)):
            raise InputError(
                f"{where}: message {turn} content must be a string or a list of parts, got "
                f"{type(content).__name__}"
            )
    if not blank and not any(message_content(message).strip() for message in prompt):
        raise InputError(f"{where}: every message's content is empty")


def reward_columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Columns other than ``prompt``, one list per column (rows missing a key get None)."""
    keys = sorted({key for row in rows for key in row if key != "prompt"})
    return {key: [row.get(key) for row in rows] for key in keys}
