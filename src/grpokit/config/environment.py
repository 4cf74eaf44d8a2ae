"""The fields of ``GRPOConfig`` for multi-turn environments (docs/environments.md): which environment, how
long an episode may run, how its per-turn rewards count. Off unless ``environment`` is set (or an
environment is given to ``GRPOTrainer``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["EnvironmentFields", "validate_environment_fields"]


@dataclass
class EnvironmentFields:
    """Multi-turn episodes (see ``GRPOConfig``)."""

    environment: str | None = None
    """The environment each prompt's G episodes run in: a built-in name (``maze``, ``calculator``) or an
    import path (``my_envs.Grid``: a class with ``reset(row)``/``step(action)``, or a function
    ``step(row, actions)``). None: single-turn completions (``GRPOTrainer(environment=...)`` also takes a
    class, factory or function)."""
    environment_kwargs: dict[str, str | int | float | bool] = field(default_factory=dict)
    """Keyword arguments the environment class is built with (one instance per episode)."""
    max_turns: int = 8
    """Policy turns per episode at most; an episode still running after them is truncated."""
    max_turn_tokens: int | None = None
    """Tokens one policy turn may generate at most; None: what is left of ``max_completion_length``, which
    bounds the whole episode (policy and environment tokens)."""
    environment_timeout: float | None = 30.0
    """Seconds one environment call (``reset`` or ``step``) may take; a slower call fails its episode, as a
    raising one does (``reward_failure``: raise, or count it and skip the episode's environment reward)."""
    max_tool_calling_iterations: int | None = None
    """TRL's name, with ``GRPOTrainer(tools=...)``: tool-calling turns per episode at most (``max_turns`` is
    then this + 1, the answer's turn); None: ``max_turns``."""
    turn_advantages: bool = False
    """Per-turn environment rewards as process supervision (each policy turn a step): token advantages from
    the group-normalised turn rewards (``process_advantage_weight``) plus the outcome advantage
    (``outcome_advantage_weight``). False: only the episode's summed reward counts, as an outcome."""


def validate_environment_fields(config: Any) -> None:
    """Ranges, as ValueErrors naming the field."""
    from grpokit.config.integrations import typed_value
    from grpokit.config.validation import require

    require(config.max_turns >= 1, "max_turns", "must be >= 1")
    require(config.max_turn_tokens is None or config.max_turn_tokens >= 1, "max_turn_tokens", "must be >= 1")
    timeout = config.environment_timeout
    require(timeout is None or timeout > 0, "environment_timeout", "must be > 0 seconds (or None: unbounded)")
    require(isinstance(config.environment_kwargs, dict), "environment_kwargs", "must be a mapping")
    # the command line gives dict values as strings: "0.02" -> 0.02, "false" -> False (as YAML reads them)
    config.environment_kwargs = {key: typed_value(value) for key, value in config.environment_kwargs.items()}
    iterations = config.max_tool_calling_iterations
    require(iterations is None or iterations >= 0, "max_tool_calling_iterations", "must be >= 0 (or None)")
