"""Where a data set comes from: a local file or folder, a name that ``datasets.load_dataset`` resolves, an
in-memory ``datasets.Dataset`` / ``DatasetDict``, or a list of dicts. Every form becomes a list of row dicts
(``source_rows``); column renames and prompt checks come after, in ``grpokit.data.loading``.

Resolution order for a string: an existing file (json, jsonl, csv, parquet), an existing folder (read by
``datasets.load_dataset(folder)`` exactly as a hub repository of data files is: ``train.jsonl`` +
``test.jsonl``, ``data/train-*.parquet`` ...), a string that can only be a local path (it has a data file
suffix, or starts with ``/``, ``.`` or ``~``: a missing file), and otherwise a hub data set name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpokit.data.integrity import InputError, MissingFileError
from grpokit.data.records import check_utf8, read_jsonl

__all__ = ["FILE_LOADERS", "source_rows", "split_field"]

FILE_LOADERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
"""Local file suffixes and the ``datasets`` builder that reads each (``.jsonl`` is read line by line)."""


def split_field(name: str) -> str:
    """The option that chooses the split of ``name`` (``grpokit train``'s, TRL ScriptArguments'): the test
    split for ``eval_dataset``."""
    return "dataset_test_split" if name == "eval_dataset" else "dataset_train_split"


def source_rows(source: Any, *, split: str, dataset_config: str | None, name: str) -> list[Any]:
    """The rows of ``source`` as a list (dict rows copied; anything else left for validation to report).

    ``split`` picks the split of a ``DatasetDict``, of a folder and of a hub name; ``dataset_config`` is
    the configuration (subset) name given to ``datasets.load_dataset`` for a folder or a hub name.
    """
    if source is None:
        owner = ", unless an `environment_factory` is provided" if name == "train_dataset" else ""
        raise InputError(
            f"`{name}` is required{owner} (a datasets.Dataset, a list of dicts, a file, folder or hub name)"
        )
    if isinstance(source, (str, os.PathLike)):
        return _path_or_name_rows(source, split, dataset_config, name)
    if isinstance(source, (list, tuple)):
        return [dict(row) if isinstance(row, Mapping) else row for row in source]
    import datasets

    if isinstance(source, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        return _split_rows(source, split, name, "the DatasetDict")
    if isinstance(source, datasets.Dataset):
        return source.to_list()
    if isinstance(source, datasets.IterableDataset):
        return [dict(row) for row in source]
    if isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
        return [dict(row) if isinstance(row, Mapping) else row for row in source]
    raise TypeError(
        f"{name}: expected a datasets.Dataset, a datasets.DatasetDict, a list of dicts, a local file or "
        f"folder, or a data set name, got {type(source).__name__}"
    )


def _path_or_name_rows(source: str | os.PathLike, split: str, dataset_config: str | None, name: str) -> list:
    path = Path(source).expanduser()
    if path.is_file():
        return _file_rows(path, name)
    if path.is_dir():
        _refuse_two_formats(path, name)
        return _load_dataset_rows(str(path), split, dataset_config, name, folder=True)
    if isinstance(source, os.PathLike) or _only_local(str(source)):
        raise MissingFileError(f"{name}: no such file or folder {str(source)!r}")
    return _load_dataset_rows(str(source), split, dataset_config, name, folder=False)


def _refuse_two_formats(folder: Path, name: str) -> None:
    """A folder holding one split in two formats (``train.jsonl`` and ``train.csv``) would be read as one
    of them, silently: refused, naming both."""
    by_split: dict[str, list[str]] = {}
    for file in sorted(folder.iterdir()):
        if file.is_file() and file.suffix.lower() in FILE_LOADERS:
            by_split.setdefault(file.stem, []).append(file.name)
    for split, names in by_split.items():
        if len(names) > 1:
            raise InputError(
                f"{name}: the folder {folder} holds {' and '.join(names)}: two files for the split "
                f"{split!r}, and only one would be read; keep one format"
            )


def _only_local(text: str) -> bool:
    """A string no hub data set name can be: it ends in a data file suffix or starts like a path."""
    return Path(text).suffix.lower() in FILE_LOADERS or text.startswith(("/", ".", "~", "\\"))


def _file_rows(path: Path, name: str) -> list[Any]:
    kind = FILE_LOADERS.get(path.suffix.lower())
    if kind is None:
        raise InputError(
            f"{name}: unsupported file type {path.suffix!r} ({path}); use one of {sorted(FILE_LOADERS)}, "
            "or a folder of such files"
        )
    if path.suffix.lower() == ".jsonl":
        return read_jsonl(path, name)
    if kind != "parquet":  # text: bytes that are not UTF-8 are named by line before the reader sees them
        check_utf8(path, name)
    import datasets

    try:
        return datasets.load_dataset(kind, data_files=str(path), split="train").to_list()
    except Exception as err:  # malformed json/csv, a damaged parquet file: the reader's reason, with the file
        raise InputError(f"{name}: {path} could not be read as {kind}: {_root_cause(err)}") from err


def _root_cause(err: BaseException) -> str:
    """The innermost cause of a reader's error (``datasets`` wraps the parser's), as ``Type: first line``."""
    while err.__cause__ is not None or err.__context__ is not None:
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _load_dataset_rows(
    target: str, split: str, dataset_config: str | None, name: str, *, folder: bool
) -> list[dict[str, Any]]:
    """``datasets.load_dataset(target, dataset_config)`` (every split, as TRL's scripts load it), then the
    chosen split's rows."""
    import datasets

    call = f"datasets.load_dataset({target!r}" + (f", {dataset_config!r})" if dataset_config else ")")
    try:
        loaded = datasets.load_dataset(target, **({"name": dataset_config} if dataset_config else {}))
    except Exception as err:  # every failure of the lookup (no network, no such repo...) with its reason
        reason = f"{type(err).__name__}: {err}"
        if folder:
            raise InputError(f"{name}={target!r}: {call} could not read the folder: {reason}") from err
        raise InputError(
            f"{name}={target!r} is not a local file or folder and could not be loaded from the hub "
            f"with {call}: {reason}"
        ) from err
    if isinstance(loaded, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        return _split_rows(loaded, split, name, f"{target!r}")
    return source_rows(loaded, split=split, dataset_config=None, name=name)


def _split_rows(splits: Mapping[str, Any], split: str, name: str, what: str) -> list[dict[str, Any]]:
    if split not in splits:
        raise InputError(
            f"{name}: {what} has no split {split!r} (splits: {sorted(splits)}); set "
            f"{split_field(name)} to one of them (grpokit train), or pass that split itself"
        )
    chosen = splits[split]
    return chosen.to_list() if hasattr(chosen, "to_list") else [dict(row) for row in chosen]
