"""Format rewards: does the completion follow the required tag structure exactly?

    r_i = 1.0 if re.fullmatch(pattern, prefix + completion_i, DOTALL) and every capture group holds
              non-whitespace text (with ``nonempty_groups=True``), else 0.0

The default patterns are written so a match takes linear time: each tag body is ``(?:(?!<tag>).)*``, which
cannot contain a tag, so there is one way to split the text and no catastrophic backtracking.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from grpokit.data.chat import completion_texts
from grpokit.rewards.base import RewardFunc

_NO_TAG = r"(?:(?!</?think>|</?answer>).)*"
THINK_PATTERN = rf"\s*<think>({_NO_TAG})</think>({_NO_TAG})"
"""``<think>reasoning</think>answer``: one think block first, then a non-empty answer, no other tags."""
ANSWER_TAG_PATTERN = rf"\s*<think>({_NO_TAG})</think>\s*<answer>({_NO_TAG})</answer>\s*"
"""``<think>reasoning</think><answer>answer</answer>`` and nothing else (R1-Zero's template)."""


def make_format_reward(
    pattern: str | re.Pattern[str] = THINK_PATTERN,
    *,
    prefix: str = "",
    nonempty_groups: bool = True,
    flags: int = re.DOTALL,
    name: str = "format_reward",
) -> RewardFunc:
    """Build ``fn(prompts, completions, completion_ids, **kw) -> [1.0 | 0.0]``: an exact-format check.

    Args:
        pattern: regular expression the whole completion must match (``re.fullmatch``).
        prefix: text prepended before matching, e.g. ``"<think>"`` when the chat template already opens the
            think block at the end of the prompt.
        nonempty_groups: also require every capture group to contain non-whitespace text.
        flags: regex flags when ``pattern`` is a string (default ``re.DOTALL``: ``.`` matches newlines).
        name: ``__name__`` of the returned function (its metric name).
    """
    regex = re.compile(pattern, flags) if isinstance(pattern, str) else pattern

    def matches(text: str) -> bool:
        match = regex.fullmatch(prefix + text)
        if match is None:
            return False
        return not nonempty_groups or all(group and group.strip() for group in match.groups())

    def format_reward(
        prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Sequence[Any] = (), **kwargs: Any
    ) -> list[float | None]:
        return [1.0 if matches(text) else 0.0 for text in completion_texts(completions)]

    format_reward.__name__ = format_reward.__qualname__ = name
    return format_reward


think_format_reward = make_format_reward(THINK_PATTERN, name="think_format_reward")
"""1.0 for ``<think>...</think>`` followed by an answer (both non-empty, no other think/answer tags)."""

answer_tag_format_reward = make_format_reward(ANSWER_TAG_PATTERN, name="answer_tag_format_reward")
"""1.0 for exactly ``<think>...</think><answer>...</answer>`` (whitespace allowed between and around)."""


def make_tag_count_reward(
    tags: Sequence[str] = ("think", "answer"), *, name: str = "tag_count_reward"
) -> RewardFunc:
    """Partial credit for the tag structure (open-r1's ``tag_count_reward``), a denser signal than 0/1.

    Each of the 2 * len(tags) markers ``<tag>`` and ``</tag>`` that occurs exactly once earns
    ``1 / (2 * len(tags))``: ``<think>a</think><answer>b</answer>`` scores 1.0, ``<think>a</think>`` 0.5.
    """
    markers = [marker for tag in tags for marker in (f"<{tag}>", f"</{tag}>")]
    if not markers:
        raise ValueError("tags must name at least one tag")

    def tag_count_reward(
        prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Sequence[Any] = (), **kwargs: Any
    ) -> list[float | None]:
        return [
            sum(text.count(marker) == 1 for marker in markers) / len(markers)
            for text in completion_texts(completions)
        ]

    tag_count_reward.__name__ = tag_count_reward.__qualname__ = name
    return tag_count_reward


tag_count_reward = make_tag_count_reward()
"""0.25 for each of ``<think>``, ``</think>``, ``<answer>``, ``</answer>`` present exactly once."""
