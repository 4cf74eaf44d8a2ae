"""Multi-turn environments and the one home of episodes: environments, tools, the episode runner and sampler.

The protocol (``base``), the built-in environments (``maze``, ``calculator``), tool calls (``tools``),
episodes (``episodes``: the runner; ``turns``: turn sessions over a backend; ``observations``: encoding
what the environment says; ``sampler``: a run's G episodes per prompt as its completions), and resolving a
config entry to an environment factory.

Usage::

    from grpokit.envs import make_environment_factory
    factory = make_environment_factory("maze", {"mode": "step"})   # or a class, a function, "module.Name"
    env = factory(); env.reset(row); turn = env.step("R")
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from grpokit.envs.base import Environment, FunctionEnvironment, Observation, Turn, as_turn, environment_reward
from grpokit.envs.game import is_game

__all__ = [
    "ENVIRONMENTS",
    "Environment",
    "FunctionEnvironment",
    "Observation",
    "Turn",
    "as_turn",
    "environment_reward",
    "game_factory",
    "make_environment_factory",
]

ENVIRONMENTS: dict[str, str] = {
    "maze": "grpokit.envs.maze:MazeEnvironment",
    "calculator": "grpokit.envs.calculator:CalculatorEnvironment",
    "kuhn_poker": "grpokit.envs.kuhn_poker:KuhnPoker",
    "tictactoe": "grpokit.envs.tictactoe:TicTacToe",
    "nim": "grpokit.envs.nim:Nim",
}
"""Built-in environments and games (``grpokit.envs.game``, played by ``grpokit.envs.selfplay``) by name ->
``module:Class`` (imported when used)."""


def make_environment_factory(spec: Any, kwargs: dict[str, Any] | None = None) -> Callable[[], Any]:
    """A no-argument factory of fresh environments (one per episode) from a config entry:

    - a built-in name (``"maze"``, ``"calculator"``) or an import path (``"my_envs.Grid"``,
      ``"my_envs:Grid"``, resolved from the working directory too);
    - a class with ``reset``/``step`` (called with ``kwargs``), or a game's class (``grpokit.envs.game.Game``:
      the factory then makes games, which ``grpokit.envs.selfplay`` plays);
    - a plain function ``step(row, actions)`` (wrapped in :class:`FunctionEnvironment`);
    - any other callable returning an environment (a factory; called with ``kwargs``).
    """
    kwargs = dict(kwargs or {})
    target = _resolve(spec) if isinstance(spec, str) else spec
    if inspect.isclass(target):
        if is_game(target):
            return lambda: target(**kwargs)
        if not (hasattr(target, "reset") and hasattr(target, "step")):
            raise TypeError(f"environment {target.__name__} needs reset(row) and step(action) methods")
        return lambda: target(**kwargs)
    if not callable(target):
        raise TypeError(f"environment must be a name, an import path, a class or a function, got {spec!r}")
    params = _positional_parameters(target)
    if params >= 2:  # step(row, actions)
        role = kwargs.pop("observation_role", "user")
        if kwargs:
            raise TypeError(f"environment_kwargs {sorted(kwargs)} given to a step function (it takes none)")
        return lambda: FunctionEnvironment(target, observation_role=role)
    return lambda: _checked(target(**kwargs), spec)


def game_factory(spec: Any, kwargs: dict[str, Any] | None = None) -> Callable[[], Any] | None:
    """A factory of ``spec``'s games (``make_environment_factory``) when it makes games
    (``grpokit.envs.game.Game``, played by ``grpokit.envs.selfplay``); None for any other environment."""
    factory = make_environment_factory(spec, kwargs)
    return factory if is_game(factory()) else None


def _resolve(name: str) -> Any:
    if name in ENVIRONMENTS:
        module, _, attr = ENVIRONMENTS[name].partition(":")
        return getattr(importlib.import_module(module), attr)
    module, _, attr = name.partition(":") if ":" in name else name.rpartition(".")
    if not module or not attr:
        known = ", ".join(sorted(ENVIRONMENTS))
        raise ValueError(f"environment {name!r}: not a built-in ({known}) nor an import path module.Name")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"environment {name!r}: cannot import {attr} from {module}: {err}") from err


def _positional_parameters(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 0
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.kind in kinds and p.default is inspect.Parameter.empty)


def _checked(env: Any, spec: Any) -> Any:
    if not (hasattr(env, "reset") and hasattr(env, "step")):
        raise TypeError(f"environment factory {spec!r} returned {type(env).__name__}, without reset/step")
    return env
