"""The environment protocol: what a multi-turn episode talks to.

An episode starts from one data-set row. The policy acts (generates until its turn ends: EOS, or the turn's
token limit), the environment answers with a :class:`Turn`: an observation appended to the context (text,
or chat messages rendered with the tokenizer's chat template), a reward for this turn if it has one, and
whether the episode is over. Observation tokens are context only: they are masked out of the loss and the
KL (``grpokit.envs.episodes``).

Two ways to write one:

- a class with ``reset(row)`` and ``step(action) -> Turn`` (one instance per episode, built by calling the
  class, or a factory, with no arguments);
- a plain function ``step(row, actions) -> Turn`` (``actions``: the policy's actions so far, the newest
  last), wrapped by :class:`FunctionEnvironment`.

A tuple ``(observation, reward, done)`` is accepted wherever a :class:`Turn` is. Imports nothing of
grpokit's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["Environment", "FunctionEnvironment", "Observation", "Turn", "as_turn", "environment_reward"]

Observation = str | Sequence[Mapping[str, Any]] | None
"""Text appended to the context as is (plain prompts) or as one message of ``observation_role`` (chat
prompts); or a list of chat messages; or None / "" for nothing."""


@dataclass
class Turn:
    """The environment's answer to one policy action."""

    observation: Observation = None
    """What the policy sees next (see :data:`Observation`); ignored when ``done``."""
    reward: float | None = None
    """This turn's reward, or None when the environment gives none for it. The episode's reward is the sum
    of its turns' rewards (None when no turn gave one)."""
    done: bool = False
    """True ends the episode."""
    info: dict[str, float] = field(default_factory=dict)
    """Counters for this turn (``{"tool_calls": 1, "tool_errors": 0}``): summed over the episode, logged as
    ``env/<key>`` (mean per episode) and passed to reward functions as the ``env_info`` column."""


@runtime_checkable
class Environment(Protocol):
    """One episode's environment. ``observation_role`` (optional class attribute, default ``"user"``) is the
    chat role of its observations, e.g. ``"tool"`` for tool results."""

    def reset(self, row: dict[str, Any]) -> None:
        """Start an episode on ``row`` (the data-set row whose ``prompt`` the policy sees)."""
        ...

    def step(self, action: str) -> Turn:
        """The policy's action (its decoded turn, without the EOS token) -> the environment's answer."""
        ...


class FunctionEnvironment:
    """An :class:`Environment` from a plain function ``step(row, actions) -> Turn | (observation, reward,
    done)``; ``actions`` holds every action of the episode so far, the newest last."""

    observation_role = "user"

    def __init__(self, step_fn: Callable[[dict[str, Any], list[str]], Any], observation_role: str = "user"):
        self.step_fn = step_fn
        self.observation_role = observation_role
        self.row: dict[str, Any] = {}
        self.actions: list[str] = []

    def reset(self, row: dict[str, Any]) -> None:
        self.row, self.actions = row, []

    def step(self, action: str) -> Turn:
        self.actions.append(action)
        return as_turn(self.step_fn(self.row, list(self.actions)))


def as_turn(value: Any) -> Turn:
    """A :class:`Turn` from a Turn or an ``(observation, reward, done)`` tuple; anything else is a
    TypeError saying what was returned."""
    if isinstance(value, Turn):
        return value
    if isinstance(value, tuple) and len(value) == 3:
        observation, reward, done = value
        return Turn(observation=observation, reward=reward, done=bool(done))
    raise TypeError(
        f"an environment step must return a Turn or (observation, reward, done), got {type(value).__name__}"
    )


def environment_reward(
    prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Any = None, **columns: Any
) -> list[float | None]:
    """The environment's own reward as a reward function (TRL signature): each episode's summed turn
    rewards, read from the ``env_reward`` column the episode runner adds (None where the environment gave
    no reward or failed)."""
    values = columns.get("env_reward")
    if values is None:
        raise ValueError("environment_reward: no env_reward column; it scores multi-turn episodes only")
    return [None if value is None else float(value) for value in values]
