"""Held-out accuracy of a built-in multi-turn task: greedy episodes in the task's environment, graded by
its correctness reward (the solve rate for ``maze``, the exact-answer rate for ``calculator``). What the
cold start probes and ``grpokit train`` reports before and after GRPO for such a task; ``grpokit eval``
reaches the same path through ``evaluate_model(episodes=...)``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grpokit.eval.generic import evaluate_model
from grpokit.rollout.episodes import EpisodeRunner

__all__ = ["task_episode_accuracy"]


def task_episode_accuracy(
    task: Any,
    model: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    *,
    max_new_tokens: int,
    max_turns: int,
    max_turn_tokens: int | None = None,
    environment_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``evaluate_model`` over greedy episodes of ``rows`` in ``task.environment`` (``environment_kwargs``
    override the task's), graded by ``task``'s correctness reward; ``accuracy`` is the share of episodes it
    scores >= 1. ``max_new_tokens`` bounds each episode's tokens, ``max_turns`` its policy turns,
    ``max_turn_tokens`` each turn (None: what is left of ``max_new_tokens``)."""
    runner = EpisodeRunner.for_rows(
        task.environment, tokenizer, rows,
        environment_kwargs={**task.environment_kwargs, **(environment_kwargs or {})},
        max_turns=max_turns, max_tokens=max_new_tokens, max_turn_tokens=max_turn_tokens, timeout=None,
        on_error="raise",
    )  # fmt: skip
    grader = task.reward_funcs[task.correctness_reward]
    return evaluate_model(
        model, tokenizer, rows, reward_funcs=[grader], max_new_tokens=max_new_tokens, episodes=runner
    )
