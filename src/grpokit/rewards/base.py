"""The reward-function contract (TRL's, unchanged), in one place.

An outcome reward function scores whole completions, with TRL's signature::

    fn(prompts, completions, completion_ids, **columns) -> list[float | None]

one value per completion, ``None`` meaning "does not apply" (left out of the weighted sum, never counted
as 0); ``columns`` are the dataset's other columns repeated per completion, plus ``trainer_state``.

A process reward function scores every step of every completion::

    fn(prompts, completions, steps, **columns) -> list[list[float] | None]

``steps[i]`` are the step strings of completion ``i``; one float per step, or ``None`` for a completion the
function does not apply to; ``columns`` also carry ``step_spans`` (each step's character span).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "ProcessRewardFunc",
    "RewardFunc",
    "column",
    "columns_read",
    "missing_columns",
    "refuse_missing_columns",
]

RewardFunc = Callable[..., list[float | None]]
"""``fn(prompts, completions, completion_ids, **columns) -> list[float | None]``."""

ProcessRewardFunc = Callable[..., Sequence[Sequence[float] | None]]
"""``fn(prompts, completions, steps, **columns) -> list[list[float] | None]``, one float per step."""


PASSED = frozenset({
    "prompts", "completions", "completion_ids", "trainer_state", "steps", "step_spans",
    "log_metric", "log_extra",
})  # fmt: skip
"""Keywords every call passes (not dataset columns)."""


def columns_read(func: Any) -> tuple[str, ...]:
    """The dataset columns ``func`` cannot do without: its ``required_columns`` attribute (the built-in
    rewards that read a column through :func:`column` declare it), else its parameters that have no default
    and are not passed by every call (``def reward(completions, solution, **kwargs)`` reads ``solution``)."""
    declared = getattr(func, "required_columns", None)
    if declared is None and isinstance(func, functools.partial):
        declared = getattr(func.func, "required_columns", None)
    if declared is not None:
        return tuple(declared)
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # a builtin or an object without a readable signature
        return ()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(
        p.name for p in parameters if p.kind in kinds and p.default is p.empty and p.name not in PASSED
    )


def missing_columns(
    funcs: Iterable[tuple[str, Any]], rows: Sequence[Mapping[str, Any]]
) -> list[tuple[str, str]]:
    """``(column, reward name)`` for every column a reward reads (``columns_read``) that no row has."""
    present = {key for row in rows for key in row}
    return [(col, name) for name, func in funcs for col in columns_read(func) if col not in present]


def refuse_missing_columns(
    names: Sequence[str], funcs: Sequence[Any], rows: Sequence[Mapping[str, Any]], source: str
) -> None:
    """Refuse ``rows`` (the data set ``source``) when a reward reads a column none of them has: every call
    would fail (or, with ``reward_failure="none"``, count as a failure at every step)."""
    from grpokit.data.integrity import InputError

    missing = missing_columns(zip(names, funcs), rows)
    if missing:
        column_name, reader = missing[0]
        present = ", ".join(sorted({key for row in rows for key in row}))
        raise InputError(
            f"{source} has no column {column_name!r}, which the reward {reader} reads (its columns: "
            f"{present}); add it, or rename one with column_mapping={{<its name>: {column_name}}}"
        )


def column(kwargs: Mapping[str, Any], name: str, n: int, reward: str) -> list[Any]:
    """The dataset column ``name`` (one value per completion), with an error that names the reward."""
    if name not in kwargs:
        present = sorted(key for key in kwargs if key != "trainer_state")
        raise KeyError(f"{reward} needs the dataset column {name!r}; the batch has columns {present}")
    values = list(kwargs[name])
    if len(values) != n:
        raise ValueError(f"{reward}: column {name!r} has {len(values)} values for {n} completions")
    return values
