"""Calls with a time limit each: one that raises or hangs is reported, never waited on forever. Used for
reward functions (``reward_timeout``, :mod:`grpokit.rewards.scoring`) and environment calls
(``environment_timeout``, :mod:`grpokit.envs.bounded`); it lives here, the lower of the two rooms (envs may
import rewards, not the other way round), and imports nothing of grpokit's.

Calls run on a pool of daemon worker threads (calls that wait on I/O, such as a tool or a judge calling a
service, overlap). A call still running ``timeout`` seconds after it started is reported as a
:class:`CallTimeout` (or the caller's subclass) and abandoned: a Python thread cannot be killed, so the
pool is replaced and the hung thread is left to finish on its own (daemon threads: it never keeps the
process from exiting, which ``concurrent.futures.ThreadPoolExecutor``'s workers would). Code that must be
stopped, not only abandoned, should run in a subprocess (the code reward's sandbox,
``grpokit.rewards.isolation``), which can be killed.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

__all__ = ["BoundedCaller", "CallTimeout"]


class CallTimeout(TimeoutError):
    """A call ran longer than its time limit."""


class BoundedCaller:
    """Runs batches of zero-argument calls, each bounded by ``timeout`` seconds (None: unbounded, and the
    calls run inline in order). ``error``: the exception type reported for a hung call; ``field``: the
    setting named when ``timeout`` is out of range; ``name``: the worker threads' name prefix."""

    def __init__(
        self,
        timeout: float | None,
        max_workers: int = 8,
        *,
        error: type[CallTimeout] = CallTimeout,
        field: str = "timeout",
        name: str = "grpokit-call",
    ) -> None:
        if timeout is not None and timeout <= 0:
            raise ValueError(f"{field} must be > 0 seconds or None, got {timeout}")
        self.timeout, self.max_workers = timeout, max_workers
        self.error, self.field, self.name = error, field, name
        self._pool: _DaemonPool | None = None

    def run(self, calls: Sequence[Callable[[], Any]]) -> list[Any]:
        """Each call's result, or the exception it raised (an :class:`EnvironmentTimeout` when it hung)."""
        if self.timeout is None:
            return [_outcome(call) for call in calls]
        if self._pool is None:
            self._pool = _DaemonPool(self.max_workers, self.name)
        started: dict[int, float] = {}

        def timed(index: int, call: Callable[[], Any]) -> Any:
            started[index] = time.monotonic()
            return call()

        futures: dict[Future, int] = {self._pool.submit(timed, i, c): i for i, c in enumerate(calls)}
        results: list[Any] = [None] * len(calls)
        pending, hung = set(futures), False
        while pending:
            done, pending = wait(pending, timeout=min(0.05, self.timeout), return_when=FIRST_COMPLETED)
            for future in done:
                error = future.exception()
                results[futures[future]] = error if error is not None else future.result()
            now = time.monotonic()
            for future in list(pending):
                index = futures[future]
                if index in started and now - started[index] > self.timeout:
                    results[index] = self.error(f"no answer within {self.field}={self.timeout:g} s")
                    pending.discard(future)
                    hung = True
        if hung:  # its worker is still busy: later calls get fresh threads
            self._pool.close()
            self._pool = None
        return results

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


class _DaemonPool:
    """``workers`` daemon threads running submitted calls in order of submission."""

    def __init__(self, workers: int, name: str) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        for index in range(workers):
            threading.Thread(target=self._work, name=f"{name}-{index}", daemon=True).start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        self._queue.put((future, fn, args))
        return future

    def close(self) -> None:
        """Idle workers exit; a busy (hung) one exits when its call returns, if ever."""
        for _ in range(64):
            self._queue.put(None)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as error:  # handed to the caller, which applies the failure policy
                    future.set_exception(error)


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as error:  # reported to the caller, which applies the failure policy
        return error
