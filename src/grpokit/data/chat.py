"""Prompts and completions as plain text or as chat messages: the one place that tells the two apart.

TRL's two dataset formats: *standard* (a prompt and a completion are strings) and *conversational* (lists of
``{"role": ..., "content": ...}`` messages). Everything in grpokit that reads a prompt or a completion goes
through these functions, so data loading, generation, reward functions, reward models, reward-model training
and evaluation agree on what the text is:

- :func:`render_prompt`: the text the policy sees: a string as is, messages through the tokenizer's chat
  template with the generation prompt (``chat_template_kwargs`` passed on, e.g. ``enable_thinking``);
- :func:`completion_text`: the text to score: a string as is, or the last message's content;
- :func:`as_completion`: what a reward function receives for generated text: the text itself for a
  standard prompt, one assistant message for a conversational one (as TRL passes it);
- :func:`render_conversation`: prompt and completion as one scored text (a sequence-classification
  reward model reads the whole conversation).

Imports nothing of grpokit's, so every room may use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "as_completion",
    "completion_text",
    "completion_texts",
    "encode_prompt",
    "is_conversational",
    "message_content",
    "render_conversation",
    "render_prompt",
]


def message_content(message: Mapping[str, Any]) -> str:
    """``message["content"]`` as a string; multimodal part lists keep only their text parts, joined (a part's
    missing or None ``text``, as ``datasets`` stores the image parts of a column of mixed parts, is empty)."""
    content = message.get("content", "")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(part.get("text") or "" for part in content if isinstance(part, Mapping))
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


def as_completion(text: str, prompt: Any) -> str | list[dict[str, str]]:
    """Generated ``text`` as reward functions receive it: a string for a standard prompt, one assistant
    message for a conversational prompt."""
    return [{"role": "assistant", "content": text}] if is_conversational(prompt) else text


def render_prompt(
    prompt: str | Sequence[Mapping[str, Any]],
    tokenizer: Any,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The text the policy sees: the prompt itself, or the chat template applied with a generation prompt
    (``chat_template_kwargs`` are passed to the template, e.g. ``{"enable_thinking": False}`` for Qwen3)."""
    if isinstance(prompt, str):
        return prompt
    if not is_conversational(prompt):
        raise TypeError(f"a prompt must be a string or a list of chat messages, got {type(prompt).__name__}")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("conversational prompts need a tokenizer with a chat_template")
    return tokenizer.apply_chat_template(
        list(prompt), tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {})
    )


def render_conversation(prompt: Any, completion: Any, tokenizer: Any) -> str:
    """Prompt and completion as one text: the chat template over the prompt's messages followed by the
    completion's (a bare string becomes one user / assistant message; no generation prompt), or the plain
    concatenation when both are strings."""
    if not (is_conversational(prompt) or is_conversational(completion)):
        return f"{prompt}{completion}"
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("conversational data but the tokenizer has no chat template")
    messages = _as_messages(prompt, "user") + _as_messages(completion, "assistant")
    return tokenizer.apply_chat_template(messages, tokenize=False)


def _as_messages(value: Any, role: str) -> list[dict[str, Any]]:
    """Chat messages as plain dicts; a bare string becomes one message with ``role``."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    return [dict(message) for message in value if isinstance(message, Mapping)]


def encode_prompt(
    prompt: Any,
    tokenizer: Any,
    max_prompt_length: int | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of a prompt (chat template for message lists, without special tokens added twice), cut
    from the left to ``max_prompt_length``."""
    text = render_prompt(prompt, tokenizer, chat_template_kwargs)
    ids = tokenizer(text, add_special_tokens=isinstance(prompt, str))["input_ids"]
    return ids[-max_prompt_length:] if max_prompt_length is not None and len(ids) > max_prompt_length else ids
