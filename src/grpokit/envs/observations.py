"""An environment's observation as the tokens appended to an episode's context.

Plain prompts: the observation text, tokenized as is (no special tokens added). Chat prompts: the
observation becomes a message (role ``observation_role``: ``"user"``, or ``"tool"`` for tool results) and
is rendered by the tokenizer's chat template, followed by the generation prompt of the next assistant turn;
the tokens are what the template puts after the EOS that ended the policy's turn. So a policy trained in
chat format sees observations exactly as its template lays out a conversation with tools.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from grpokit.data.chat import message_content

__all__ = ["ObservationEncoder"]

logger = logging.getLogger(__name__)
_BEFORE = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]


class ObservationEncoder:
    """``encoder(observation, role) -> token ids`` (see the module docstring)."""

    def __init__(
        self, tokenizer: Any, chat: bool, chat_template_kwargs: dict[str, Any] | None = None
    ) -> None:
        if chat and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "conversational prompts with an environment need a tokenizer with a chat_template"
            )
        self.tokenizer, self.chat = tokenizer, chat
        self.kwargs = dict(chat_template_kwargs or {})

    def __call__(self, observation: Any, role: str = "user") -> list[int]:
        if observation is None or (isinstance(observation, str) and not observation):
            return []
        messages = _as_messages(observation, role)
        text = self._after_turn(messages) if self.chat else "".join(message_content(m) for m in messages)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _after_turn(self, messages: list[dict[str, Any]]) -> str:
        """The template's text after the end of an assistant turn: the messages, then the generation
        prompt. Some templates render the last assistant message differently once more messages follow
        (Qwen3's drops its empty ``<think>`` block): then the text after as many EOS as end that turn."""
        render = self.tokenizer.apply_chat_template
        before = render(_BEFORE, tokenize=False, **self.kwargs)
        full = render(_BEFORE + messages, tokenize=False, add_generation_prompt=True, **self.kwargs)
        eos = self.tokenizer.eos_token or ""
        end = before.rfind(eos) + len(eos) if eos and eos in before else len(before)
        if full.startswith(before[:end]):
            return full[end:]
        ends = before[:end].count(eos) if eos else 0  # EOS up to the end of the assistant turn
        if ends and full.count(eos) > ends:
            at = -len(eos)
            for _ in range(ends):
                at = full.index(eos, at + len(eos))
            return full[at + len(eos) :]
        raise ValueError("the chat template renders earlier messages differently once more follow")


def _as_messages(observation: Any, role: str) -> list[dict[str, Any]]:
    if isinstance(observation, str):
        return [{"role": role, "content": observation}]
    if isinstance(observation, Sequence) and all(isinstance(m, Mapping) for m in observation):
        return [dict(m) for m in observation]
    raise TypeError(
        f"an observation must be text or a list of chat messages, got {type(observation).__name__}"
    )
