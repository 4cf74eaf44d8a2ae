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

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["ProcessRewardFunc", "RewardFunc", "column"]

RewardFunc = Callable[..., list[float | None]]
"""``fn(prompts, completions, completion_ids, **columns) -> list[float | None]``."""

ProcessRewardFunc = Callable[..., Sequence[Sequence[float] | None]]
"""``fn(prompts, completions, steps, **columns) -> list[list[float] | None]``, one float per step."""


def column(kwargs: Mapping[str, Any], name: str, n: int, reward: str) -> list[Any]:
    """The dataset column ``name`` (one value per completion), with an error that names the reward."""
    if name not in kwargs:
        present = sorted(key for key in kwargs if key != "trainer_state")
        raise KeyError(f"{reward} needs the dataset column {name!r}; the batch has columns {present}")
    values = list(kwargs[name])
    if len(values) != n:
        raise ValueError(f"{reward}: column {name!r} has {len(values)} values for {n} completions")
    return values
