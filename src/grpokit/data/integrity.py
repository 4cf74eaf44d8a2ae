"""Files a run reads back (checkpoints, model directories), checked cheaply before they are used: a file that
is cut off or damaged is named in one sentence ("corrupt or truncated"), never left to a JSON or torch
traceback, and never worded like the refusal of a file that holds code.

The checks read only what locates the data: a JSON file whole (they are small), a torch file's zip
directory (at its end: a truncated file has none), a safetensors file's header (its tensors' extents, which
the file's size must cover). Imports nothing of grpokit's.
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path
from typing import Any

__all__ = [
    "CorruptFileError",
    "InputError",
    "MissingFileError",
    "check_model_dir",
    "check_safetensors_file",
    "check_torch_file",
    "corrupt",
    "read_json_file",
]


class InputError(ValueError):
    """A bad input, refused in one sentence that names it and says what to do; ``grpokit``'s command line
    prints it without a traceback."""


class MissingFileError(InputError, FileNotFoundError):
    """A file or folder an option names that does not exist."""


class CorruptFileError(InputError):
    """A file that is cut off or damaged."""


def corrupt(path: Path, what: str, detail: str) -> CorruptFileError:
    """The error for ``path`` (``what``: the input it belongs to, e.g. ``resume_from_checkpoint``)."""
    return CorruptFileError(
        f"{what}: {path} is corrupt or truncated ({detail}); restore it, or use another copy"
    )


def read_json_file(path: str | Path, what: str) -> Any:
    """The JSON value in ``path``; a file that is not valid JSON (or not UTF-8 text) is a
    :class:`CorruptFileError` naming it and the line."""
    path = Path(path)
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise corrupt(path, what, f"byte {err.start} is not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise corrupt(path, what, f"not valid JSON: {err.msg} at line {err.lineno}") from None


def check_torch_file(path: str | Path, what: str) -> None:
    """A ``torch.save`` file (a zip archive) whose directory is readable: a truncated one has lost it."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise corrupt(path, what, f"not a complete torch.save archive: {err}") from None
    if not any(name.endswith("data.pkl") for name in names):
        raise corrupt(path, what, "the archive holds no data.pkl")


def check_safetensors_file(path: str | Path, what: str) -> None:
    """A safetensors file whose header parses and whose size covers every tensor the header lists."""
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise corrupt(path, what, f"{size} bytes, shorter than a safetensors header")
        (length,) = struct.unpack("<Q", prefix)
        if length > size - 8:
            raise corrupt(path, what, f"its header claims {length} bytes, the file has {size - 8} after it")
        try:
            header = json.loads(handle.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise corrupt(path, what, "its header is not valid JSON") from None
    ends = [
        int(entry["data_offsets"][1])
        for name, entry in header.items()
        if name != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry
    ]
    needed = 8 + length + max(ends, default=0)
    if size < needed:
        raise corrupt(path, what, f"its tensors need {needed} bytes, the file has {size}")


MODEL_JSON = ("config.json", "generation_config.json", "tokenizer_config.json", "adapter_config.json")


def check_model_dir(path: str | Path, what: str = "model") -> None:
    """A local model directory's small JSON files parse and its safetensors files are whole; a damaged one
    is a :class:`CorruptFileError` naming it (``from_pretrained`` would fail on it less clearly, or later)."""
    path = Path(path).expanduser()
    if not path.is_dir():
        return
    for name in MODEL_JSON:
        if (path / name).is_file():
            read_json_file(path / name, what)
    for file in sorted(path.glob("*.safetensors")):
        check_safetensors_file(file, what)
