"""What ``grpokit train`` measures before and after GRPO, decided before any model loads and written to
``eval_summary.json`` (``held_out``) and the model card, so the numbers never describe another data set.

* **Rows**: ``eval_dataset`` when given; else the built-in task's held-out split when the task supplies the
  training prompts. A run on its own ``dataset`` without an ``eval_dataset`` has no held-out rows of its data:
  the evaluation is skipped and the reason printed and recorded (the task's questions are not the user's).
* **Grader**: the built-in task's (its correctness reward and answer extractor, or episodes in its
  environment) when the task supplies the rewards (no ``reward_funcs``) or all the data (neither ``dataset``
  nor ``eval_dataset``); otherwise the run's own reward functions with its ``reward_weights`` (``accuracy``:
  the share of greedy completions whose weighted reward is >= 1; ``mean_reward``).
* Every column the grader reads must be in the held-out rows: a file without one is refused here, naming the
  file and the column, before the cold start or any evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpokit.data.integrity import InputError

__all__ = ["HeldOut", "plan_held_out"]


@dataclass
class HeldOut:
    """The held-out evaluation of a ``grpokit train`` run."""

    rows: list[dict[str, Any]] | None
    """The rows, loaded and checked; None when skipped."""
    dataset: str
    """What the rows are, for the summary and the card."""
    task: str | None
    """The built-in task whose grader grades them (None: the run's reward functions)."""
    skipped: str | None = None
    """Why there is no held-out evaluation."""

    def graded_by(self, reward_names: list[str] | None = None) -> str:
        if self.task is not None:
            return f"the built-in `{self.task}` task's grader (its correctness reward and answer format)"
        names = ", ".join(f"`{name}`" for name in reward_names or []) or "the run's reward functions"
        return f"the run's reward functions ({names}, weighted as in training; correct when >= 1)"

    def describe(self, reward_names: list[str] | None = None) -> dict[str, Any]:
        """``eval_summary.json``'s ``held_out``: what was measured, or why nothing was."""
        if self.skipped is not None:
            return {"skipped": self.skipped}
        assert self.rows is not None
        return {
            "dataset": self.dataset,
            "num_examples": len(self.rows),
            "graded_by": self.graded_by(reward_names),
        }


def plan_held_out(args: Any, config: Any, eval_rows: Any, rewards: list[Any]) -> HeldOut:
    """The held-out evaluation of ``args`` (``TrainArgs``): ``eval_rows`` are ``training_data``'s (the
    eval_dataset or the task's split), ``rewards`` the run's reward specifications. Raises InputError for
    held-out rows that lack a column their grader reads."""
    from grpokit.data.loading import load_dataset_rows

    task_grades = args.task is not None and (
        not args.reward_funcs or (args.dataset is None and args.eval_dataset is None)
    )
    dataset = _describe_rows(args)
    if not args.evaluate:
        return HeldOut(None, dataset, None, "evaluate=false")
    if args.eval_dataset is None and args.dataset is not None:
        return HeldOut(
            None, dataset, None,
            f"dataset={args.dataset} replaces the task's data and no eval_dataset holds out rows of it; give "
            "eval_dataset=<held-out rows of your data> to evaluate before and after training",
        )  # fmt: skip
    if eval_rows is None:
        return HeldOut(None, dataset, None, "no eval_dataset and no built-in task to hold out rows")
    if not task_grades and config.environment is not None:
        return HeldOut(
            None, dataset, None,
            "a multi-turn run without a built-in task is not evaluated here; use grpokit eval "
            "environment=...",
        )  # fmt: skip
    rows = load_dataset_rows(eval_rows, config.data_settings(), name="eval_dataset")
    graders = _task_graders(args.task) if task_grades else _run_graders(rewards)
    _refuse_missing_columns(graders, rows, args, task_grades)
    return HeldOut(rows, dataset, args.task if task_grades else None)


def _describe_rows(args: Any) -> str:
    if args.eval_dataset is not None:
        return f"eval_dataset {args.eval_dataset}"
    if args.task is not None and args.dataset is None:
        return f"the built-in `{args.task}` task's held-out split"
    return "none"


def _task_graders(task_name: str) -> list[tuple[str, Any]]:
    """The task's correctness reward, and ``solution`` (its answer extractor compares with it) for a
    single-turn task."""
    from grpokit.tasks import get_task

    task = get_task(task_name)
    graders = [(task.correctness_reward, task.reward_funcs[task.correctness_reward])]
    if task.environment is None:
        graders.append((f"the `{task_name}` task's answer check", _ReadsSolution()))
    return graders


class _ReadsSolution:
    """Stands for the task's answer extractor, which compares with each row's ``solution``."""

    required_columns = ("solution",)


def _run_graders(rewards: list[Any]) -> list[tuple[str, Any]]:
    """The run's reward functions by name (reward-model directories read no column and are not loaded
    here)."""
    from grpokit.rewards import resolve_reward
    from grpokit.rewards.scoring import reward_name

    graders = []
    for spec in rewards:
        if isinstance(spec, (str, Path)) and Path(str(spec)).is_dir():
            continue
        func = resolve_reward(spec)
        graders.append((reward_name(func), func))
    return graders


def _refuse_missing_columns(
    graders: list[tuple[str, Any]], rows: list[dict[str, Any]], args: Any, task_grades: bool
) -> None:
    from grpokit.rewards.base import missing_columns

    missing = missing_columns(graders, rows)
    if not missing:
        return
    column, reader = missing[0]
    where = f"eval_dataset {args.eval_dataset}" if args.eval_dataset is not None else "the held-out rows"
    present = sorted({key for row in rows for key in row})
    grader = f"the `{args.task}` task's grader" if task_grades else "the run's reward functions"
    raise InputError(
        f"{where} has no column {column!r}, which {reader} ({grader}) reads to grade the held-out "
        f"evaluation (its columns: {', '.join(present)}); add the column, or rename one with "
        f"column_mapping={{<its name>: {column}}}"
    )
