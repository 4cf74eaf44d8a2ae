"""Text of prompts and completions, whether plain strings or chat messages.

Every built-in reward reads completions through :func:`completion_text`, so all of them accept both dataset
formats: a plain string, or a list of ``{"role": ..., "content": ...}`` messages (the last message's content
is scored; content given as a list of ``{"type": "text", "text": ...}`` parts is joined).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def message_content(message: Mapping[str, Any]) -> str:
    """``message["content"]`` as a string; multimodal part lists keep only their text parts, joined."""
    content = message.get("content", "")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    raise TypeError(f"message content must be a string or a list of parts, got {type(content).__name__}")


def is_conversational(value: Any) -> bool:
    """True for a list of chat messages (dicts with a ``role``), False for a plain string."""
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and all(isinstance(message, Mapping) and "role" in message for message in value)
    )


def completion_text(completion: str | Sequence[Mapping[str, Any]]) -> str:
    """The text to score: the string itself, or the content of the last message (``""`` for no messages)."""
    if isinstance(completion, str):
        return completion
    if is_conversational(completion):
        return message_content(completion[-1]) if completion else ""
    kind = type(completion).__name__
    raise TypeError(f"a completion must be a string or a list of {{'role', 'content'}} messages, got {kind}")


def completion_texts(completions: Sequence[Any]) -> list[str]:
    """:func:`completion_text` of every completion of a batch."""
    return [completion_text(completion) for completion in completions]


def column(kwargs: Mapping[str, Any], name: str, n: int, reward: str) -> list[Any]:
    """The dataset column ``name`` (one value per completion), with an error that names the reward."""
    if name not in kwargs:
        present = sorted(key for key in kwargs if key != "trainer_state")
        raise KeyError(f"{reward} needs the dataset column {name!r}; the batch has columns {present}")
    values = list(kwargs[name])
    if len(values) != n:
        raise ValueError(f"{reward}: column {name!r} has {len(values)} values for {n} completions")
    return values
