"""Final-answer extraction from a completion, in linear time (safe on megabyte-long adversarial text).

Each extractor returns the answer string, or ``None`` when the completion holds no answer of that form:

============== ======================================================================================
``boxed``      content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces matched); ``None``
               when that last box is never closed (a truncated completion)
``answer_tag`` content of the last ``<answer>...</answer>``
``hash``       rest of the line after the last ``####`` (GSM8K), trailing full stop removed
``last_number`` the last number in the text (``-1,234.5``, ``3/4``)
``auto``       ``answer_tag``, then ``boxed``, then ``hash``, then ``last_number``: the first that finds one
============== ======================================================================================

``integer_answer`` is the built-in tasks' (and the calculator environment's) reading: the integer in the
last ``<answer>...</answer>``, normalised (``051`` -> ``51``), None for anything but an integer.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from grpokit.data.chat import completion_text

Extractor = Callable[[str], "str | None"]

_BOX_COMMANDS = ("\\boxed", "\\fbox")
MAX_ANSWER_DIGITS = 64
"""Longer digit strings are not an integer answer (and ``int()`` refuses more than 4300 digits)."""
_INTEGER = re.compile(rf"-?\d{{1,{MAX_ANSWER_DIGITS}}}")
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def _matching_brace(text: str, open_index: int) -> int | None:
    """Index of the ``}`` that closes the ``{`` at ``open_index``, or None. O(len(text))."""
    depth = 0
    for index in range(open_index, len(text)):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``); ``\\boxed 5`` (no braces) gives ``5``."""
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    command = next(command for command in _BOX_COMMANDS if text.startswith(command, start))
    rest = start + len(command)
    while rest < len(text) and text[rest] == " ":
        rest += 1
    if rest < len(text) and text[rest] == "{":
        close = _matching_brace(text, rest)
        return None if close is None else text[rest + 1 : close].strip()
    if rest > start + len(command):  # "\boxed 5": one token after a space
        token = re.match(r"[^\s$]+", text[rest : rest + 256])
        return token.group(0) if token else None
    return None


def extract_answer_tag(text: str, tag: str = "answer") -> str | None:
    """Content of the last ``<tag>...</tag>`` pair (stripped), or None."""
    start = text.rfind(f"<{tag}>")
    if start < 0:
        return None
    start += len(tag) + 2
    end = text.find(f"</{tag}>", start)
    return None if end < 0 else text[start:end].strip()


def integer_answer(completion: Any) -> str | None:
    """The integer in the last ``<answer>...</answer>`` as a normalised string, or None.

    ``"...<answer> 051 </answer>"`` gives ``"51"``; ``"<answer>6.3</answer>"``, ``"<answer>1+2</answer>"``,
    an unclosed tag or no tag give None. ``completion`` is a string or a list of chat messages (the last
    message's content is read).
    """
    inner = extract_answer_tag(completion_text(completion))
    if inner is None or not _INTEGER.fullmatch(inner):
        return None
    return str(int(inner))


def extract_hash_answer(text: str) -> str | None:
    """The rest of the line after the last ``####`` (GSM8K format), or None when empty."""
    start = text.rfind("####")
    if start < 0:
        return None
    answer = text[start + 4 :].split("\n", 1)[0].strip().rstrip(".").strip()
    return answer or None


def extract_last_number(text: str) -> str | None:
    """The last number in the text (integers, decimals, thousands commas, simple fractions), or None."""
    last = None
    for last in _NUMBER.finditer(text):  # noqa: B007 - keep the last match
        pass
    return None if last is None else last.group(0)


def extract_auto(text: str) -> str | None:
    """``<answer>`` tag, else ``\\boxed{}``, else ``####``, else the last number."""
    for extractor in (extract_answer_tag, extract_boxed, extract_hash_answer, extract_last_number):
        answer = extractor(text)
        if answer:
            return answer
    return None


EXTRACTORS: dict[str, Extractor] = {
    "auto": extract_auto,
    "boxed": extract_boxed,
    "answer_tag": extract_answer_tag,
    "hash": extract_hash_answer,
    "last_number": extract_last_number,
}


def get_extractor(extract: str | Extractor) -> Extractor:
    """An extractor by name (keys of :data:`EXTRACTORS`), or a callable ``str -> str | None`` as is."""
    if callable(extract):
        return extract
    if extract not in EXTRACTORS:
        raise ValueError(f"unknown answer extraction {extract!r}; choose one of {sorted(EXTRACTORS)}")
    return EXTRACTORS[extract]
