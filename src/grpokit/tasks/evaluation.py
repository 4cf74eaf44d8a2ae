"""Held-out accuracy of a built-in task, graded as the task grades: greedy completions scored by its
correctness reward (and its answer extractor, for ``format_rate`` and ``maj@k``), or, for a multi-turn task,
greedy episodes in the task's environment (the solve rate for ``maze``, the exact-answer rate for
``calculator``). What ``grpokit train`` reports before and after GRPO and what the cold start probes;
``grpokit eval`` reaches the episode path through ``evaluate_model(episodes=...)``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grpokit.envs.episodes import EpisodeRunner
from grpokit.eval import evaluate_accuracy, evaluate_model
from grpokit.tasks.registry import Task, get_task

__all__ = ["game_evaluation", "task_accuracy", "task_episode_accuracy", "task_game", "task_graders"]


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


def game_evaluation(
    make_game: Any,
    model: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    *,
    max_new_tokens: int,
    max_turn_tokens: int | None = None,
    temperature: float = 1.0,
    seed: int = 0,
) -> dict[str, Any]:
    """A game's policy against the random player and (where the game has one) the expert player on
    ``rows``: one game per seat and deal, sampled at ``temperature`` from ``seed``
    (``eval.games.play_games``); for Kuhn poker also the exact exploitability. ``accuracy``: the share of
    games not lost to the expert (1.0 is perfect play in tic-tac-toe; without an expert, to the random
    player); ``game/legal_rate``: policy turns that named a legal move."""
    from grpokit.envs.kuhn_poker import KuhnPoker
    from grpokit.eval.games import kuhn_exploitability, play_games

    probe = make_game()
    opponents = ["random"] + (["expert"] if callable(getattr(probe, "expert_move", None)) else [])
    out: dict[str, Any] = {}
    for opponent in opponents:
        out.update(play_games(
            model, tokenizer, rows, make_game, opponent=opponent, max_tokens=max_new_tokens,
            max_turn_tokens=max_turn_tokens, temperature=temperature, seed=seed,
        ))  # fmt: skip
    out["game/legal_rate"] = 1 - sum(out[f"game/{o}/illegal_rate"] for o in opponents) / len(opponents)
    if isinstance(probe, KuhnPoker):
        prompt = list(tokenizer(rows[0]["prompt"], add_special_tokens=False)["input_ids"])
        out["game/exploitability"] = kuhn_exploitability(model, tokenizer, prompt)
    out["accuracy"] = 1 - out[f"game/{opponents[-1]}/loss"]
    out["num_examples"] = len(rows)
    return out


def task_game(task: Any) -> Any:
    """A no-argument factory of ``task``'s games when its environment is a game, else None."""
    if task.environment is None:
        return None
    from grpokit.envs import game_factory

    return game_factory(task.environment, task.environment_kwargs)


def task_graders(task_name: str) -> dict[str, Any]:
    """``evaluate_accuracy`` keyword arguments of a built-in task: its correctness reward and its answer
    extractor (for ``format_rate`` and ``maj@k``)."""
    task = get_task(task_name)
    return {"reward_fn": task.reward_funcs[task.correctness_reward], "extract_fn": task.extract_answer}


def task_accuracy(
    model: Any,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    task_name: str,
    *,
    max_new_tokens: int,
    max_turns: int,
    max_turn_tokens: int | None = None,
    environment_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Greedy accuracy of ``model`` on ``rows``, graded as task ``task_name`` grades (a multi-turn task:
    episodes in its environment, bounded by ``max_turns`` and ``max_turn_tokens``, built with
    ``environment_kwargs`` over the task's own)."""
    task: Task = get_task(task_name)
    make_game = task_game(task)
    if make_game is not None:
        return game_evaluation(
            make_game, model, tokenizer, rows, max_new_tokens=max_new_tokens, max_turn_tokens=max_turn_tokens
        )
    if task.environment is not None:
        return task_episode_accuracy(
            task, model, tokenizer, rows, max_new_tokens=max_new_tokens, max_turns=max_turns,
            max_turn_tokens=max_turn_tokens, environment_kwargs=environment_kwargs,
        )  # fmt: skip
    return evaluate_accuracy(model, tokenizer, rows, max_new_tokens=max_new_tokens, **task_graders(task_name))
