"""Calling many environments at once with a time limit per call (``environment_timeout``): one that raises
or hangs is reported, never waited on forever. The machinery is :mod:`grpokit.rewards.bounded` (reward
functions use it too); here it reports a hung call as an :class:`EnvironmentTimeout`."""

from __future__ import annotations

from grpokit.rewards.bounded import BoundedCaller as _BoundedCaller
from grpokit.rewards.bounded import CallTimeout

__all__ = ["BoundedCaller", "EnvironmentTimeout"]


class EnvironmentTimeout(CallTimeout):
    """An environment call ran longer than its time limit."""


class BoundedCaller(_BoundedCaller):
    """Environment calls (``reset``, ``step``), each bounded by ``timeout`` seconds (None: unbounded, inline,
    in order); a hung call is reported as an :class:`EnvironmentTimeout`."""

    def __init__(self, timeout: float | None, max_workers: int = 8) -> None:
        super().__init__(
            timeout, max_workers, error=EnvironmentTimeout, field="environment_timeout", name="grpokit-env"
        )
