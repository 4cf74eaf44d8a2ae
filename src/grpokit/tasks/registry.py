"""The registry of built-in tasks: what a task is (``Task``), the registered ones (``TASKS``), and
``get_task`` / ``register_task``. Importing it registers ``arithmetic``, ``chain``, ``maze``,
``maze_path`` and ``calculator``."""


from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grpokit.data.integrity import InputError
from grpokit.envs.base import environment_reward
from grpokit.tasks.arithmetic import (
    arithmetic_exact_answer_reward,
    arithmetic_format_reward,
    extract_answer,
    make_arithmetic_splits,
    worked_solution,
)
from grpokit.tasks.chain import (
    chain_outcome_reward,
    chain_step_reward,
    chain_step_reward_local,
    extract_chain_answer,
    make_chain_splits,
)
from grpokit.tasks.chain import worked_solution as chain_worked_solution

__all__ = ["TASKS", "Task", "get_task", "register_task"]


@dataclass(frozen=True)
class Task:
    """A built-in task: how to make its data, how to score completions, and what a good completion is."""

    name: str
    """Registry name (``get_task(name)``)."""
    make_splits: Callable[..., tuple[list[dict[str, Any]], list[dict[str, Any]]]]
    """``make_splits(seed=0, num_train=..., num_test=..., **difficulty) -> (train_rows, test_rows)``;
    rows have ``prompt`` and ``solution``."""
    reward_funcs: dict[str, Callable[..., list[float | None]]]
    """Reward functions by name, TRL signature ``fn(prompts, completions, completion_ids, **columns)``."""
    default_reward_weights: dict[str, float]
    """Weight of each reward function in the summed reward, same keys as ``reward_funcs``."""
    worked_solution: Callable[[dict[str, Any]], str]
    """The completion text a row's supervised cold start is trained on (without EOS)."""
    extract_answer: Callable[[Any], str | None]
    """The answer in a completion (string or chat messages), normalised, or None."""
    correctness_reward: str
    """Name of the reward in ``reward_funcs`` that is 1.0 exactly when the answer is right."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """Default keyword arguments of ``make_splits`` (for display and caching)."""
    process_reward_funcs: dict[str, Callable[..., Any]] = field(default_factory=dict)
    """Rule-based process (per-step) reward functions by name; empty when the task has none."""
    environment: str | None = None
    """Name of the built-in environment (``grpokit.envs.ENVIRONMENTS``) whose episodes this task's rows
    start; None for single-turn tasks."""
    environment_kwargs: dict[str, Any] = field(default_factory=dict)
    """Default keyword arguments of that environment (a recipe's ``environment_kwargs`` override them)."""
    worked_episode: Callable[[dict[str, Any]], list[tuple[str, bool]]] | None = None
    """Multi-turn tasks: the cold start's episode for a row as ``(text, is_policy)`` segments in order,
    policy turns (EOS appended after each at tokenization, as the policy ends its turns) and the
    environment's observations between them (context only, not trained on). None: single-turn
    (``worked_solution``)."""
    tokenizer_tags: tuple[str, ...] = ()
    """Tags the tiny character tokenizer adds as single tokens for this task (beyond answer/think)."""
    cold_start: dict[str, Any] = field(default_factory=dict)
    """The task's defaults for ``grpokit.models.ColdStartSettings`` (the caller's settings override them)."""


TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    """Add a task to the registry (replacing one of the same name) and return it."""
    if set(task.default_reward_weights) - set(task.reward_funcs):
        raise ValueError(f"task {task.name!r}: reward weights name unknown reward functions")
    if task.correctness_reward not in task.reward_funcs:
        raise ValueError(
            f"task {task.name!r}: correctness_reward {task.correctness_reward!r} is not a reward"
        )
    TASKS[task.name] = task
    return task


def get_task(name: str) -> Task:
    """The registered task called ``name``; an ``UnknownTaskError`` (a KeyError and an InputError) lists
    the known names."""
    try:
        return TASKS[name]
    except KeyError:
        known = ", ".join(sorted(TASKS))
        raise UnknownTaskError(f"task: unknown task {name!r}; known tasks: {known}") from None


class UnknownTaskError(KeyError, InputError):
    """A task name no task is registered under."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


register_task(
    Task(
        name="arithmetic",
        make_splits=make_arithmetic_splits,
        reward_funcs={"exact_answer": arithmetic_exact_answer_reward, "format": arithmetic_format_reward},
        default_reward_weights={"exact_answer": 1.0, "format": 0.1},
        worked_solution=worked_solution,
        extract_answer=extract_answer,
        correctness_reward="exact_answer",
        defaults={"num_train": 20_000, "num_test": 500, "num_terms": 2, "num_digits": 3},
    )
)

register_task(
    Task(
        name="chain",
        make_splits=make_chain_splits,
        reward_funcs={"exact_answer": chain_outcome_reward},
        default_reward_weights={"exact_answer": 1.0},
        worked_solution=chain_worked_solution,
        extract_answer=extract_chain_answer,
        correctness_reward="exact_answer",
        defaults={"num_train": 5000, "num_test": 200, "num_ops": 3},
        process_reward_funcs={"chain_steps": chain_step_reward, "chain_steps_local": chain_step_reward_local},
    )
)


def _register_multi_turn() -> None:
    """The environment tasks (imported here: their modules import the environments)."""
    from grpokit.envs.maze import maze_solved_reward
    from grpokit.tasks import calculator, maze  # submodules, not this registry

    # maze: one move per turn; maze_path: the whole path in one turn. Trained on the environment's reward
    # (penalties included, if any), graded on reaching the exit.
    for name, mode, cold_start in (
        ("maze", "step", {"max_new_tokens": 80, "num_sft_examples": 5000}),
        ("maze_path", "path", {"max_new_tokens": 40, "num_sft_examples": 5000, "max_turns": 1}),
    ):
        register_task(
            Task(
                name=name,
                make_splits=functools.partial(maze.make_maze_splits, mode=mode),
                reward_funcs={"environment": environment_reward, "solved": maze_solved_reward},
                default_reward_weights={"environment": 1.0, "solved": 0.0},
                worked_solution=maze.worked_solution,
                extract_answer=maze.extract_path,
                correctness_reward="solved",
                defaults={"num_train": 5000, "num_test": 200, "height": 4, "width": 4, "mode": mode},
                environment="maze",
                worked_episode=maze.worked_episode,
                cold_start=cold_start,
            )
        )
    register_task(
        Task(
            name="calculator",
            make_splits=calculator.make_calculator_splits,
            reward_funcs={"exact_answer": calculator.calculator_exact_answer_reward},
            default_reward_weights={"exact_answer": 1.0},
            worked_solution=calculator.worked_solution,
            extract_answer=calculator.extract_answer,
            correctness_reward="exact_answer",
            defaults={"num_train": 5000, "num_test": 200, "num_digits": 3, "tool_fraction": 0.3},
            environment="calculator",
            worked_episode=calculator.worked_episode,
            tokenizer_tags=calculator.TOOL_TAGS,
            # a fixed SFT budget: greedy accuracy stays near 0 (the direct answers, 70% of the SFT episodes,
            # are guesses) however long it trains, so there is no accuracy to stop at
            cold_start={
                "max_new_tokens": 96,
                "num_sft_examples": 5000,
                "stop_at_accuracy": None,
                "max_steps": 600,
                "probe_every": 100,
            },
        )
    )


_register_multi_turn()


def _register_games() -> None:
    """The game tasks (``grpokit.tasks.games``): deals played by self-play, trained on each seat's return."""
    from grpokit.envs.game import boxed_move
    from grpokit.tasks import games

    for name, cold_start in (
        ("kuhn_poker", {"max_new_tokens": 160, "num_sft_examples": 3000, "stop_at_accuracy": 0.95,
                        "probe_size": 24}),
        ("tictactoe", {"max_new_tokens": 192, "num_sft_examples": 5000, "stop_at_accuracy": 0.95,
                       "probe_size": 24}),
    ):  # fmt: skip
        register_task(
            Task(
                name=name,
                make_splits=functools.partial(games.game_splits, name),
                reward_funcs={"environment": environment_reward},
                default_reward_weights={"environment": 1.0},
                worked_solution=games.worked_move,
                extract_answer=boxed_move,
                correctness_reward="environment",
                defaults={"num_train": 5000, "num_test": 60},
                environment=name,
                worked_episode=games.worked_game,
                tokenizer_tags=("\\boxed{",),
                cold_start=cold_start,
            )
        )


_register_games()
