"""JSON-lines files (metrics, completions, labelled samples, data sets): one reader, one writer.

Numbers are written with :func:`json_number`: NaN and infinities become ``null`` (JSON has no NaN), so every
line is valid JSON that any reader accepts. The reader names the file and the line of a malformed record.
A file that is not UTF-8 text is refused naming the line (``check_utf8``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from grpokit.data.integrity import InputError

__all__ = [
    "append_jsonl",
    "check_utf8",
    "drop_steps_after",
    "json_number",
    "read_jsonl",
    "write_jsonl",
]


def json_number(value: float, digits: int | None = None) -> float | None:
    """``value`` as a JSON number: None for NaN or +-inf, else a float (rounded to ``digits`` if given)."""
    number = float(value)
    if math.isnan(number) or math.isinf(number):
        return None
    return round(number, digits) if digits is not None else number


def read_jsonl(path: str | Path, name: str = "file") -> list[Any]:
    """The records of a JSON-lines file (blank lines skipped). A malformed line, or one that is not UTF-8
    text, is a ValueError naming ``name``, the path and the line number."""
    path = Path(path)
    records = []
    for line_no, raw in enumerate(path.read_bytes().splitlines(), start=1):
        line = _utf8_line(raw, path, line_no, name)
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise InputError(f"{name}: {path} line {line_no} is not valid JSON: {err.msg}") from err
    return records


def _utf8_line(raw: bytes, path: Path, line_no: int, name: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(_not_utf8(name, path, line_no, raw, err)) from None


def _not_utf8(name: str, path: Path, line_no: int, line: bytes, err: UnicodeDecodeError) -> str:
    byte = line[err.start : err.start + 1].hex()
    return (
        f"{name}: {path} line {line_no} is not UTF-8 text (byte 0x{byte} at column {err.start + 1}); "
        "save the file as UTF-8"
    )


def check_utf8(path: str | Path, name: str = "file") -> None:
    """Raise a ValueError naming ``name``, the path and the line when ``path`` holds bytes that are not
    UTF-8 (read line by line, so a large file is never held whole)."""
    path = Path(path)
    with path.open("rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            _utf8_line(raw, path, line_no, name)


def append_jsonl(path: str | Path, records: Iterable[Any]) -> None:
    """Append one JSON line per record (creating the file and its directory when missing)."""
    _write(Path(path), records, "a")


def write_jsonl(path: str | Path, records: Iterable[Any]) -> None:
    """Write one JSON line per record, replacing the file."""
    _write(Path(path), records, "w")


def _write(path: Path, records: Iterable[Any], mode: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open(mode) as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")


def drop_steps_after(path: str | Path, step: int) -> None:
    """Keep only the records of ``path`` whose ``step`` is at most ``step`` (a resumed run writes the later
    steps again, so each step stays once); nothing when the file does not exist."""
    file = Path(path)
    if file.exists():
        write_jsonl(file, [r for r in read_jsonl(file, file.name) if r.get("step", 0) <= step])
