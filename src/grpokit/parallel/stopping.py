"""What stops a run early, and how: NaN/inf steps in a row (an error saying what to check), and SIGTERM or
SIGINT (a preempted job, Ctrl-C: the current step finishes, a checkpoint is saved, the run ends cleanly)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

__all__ = ["NonfiniteGuard", "RunInterrupted", "StopSignals"]


class NonfiniteGuard:
    """Counts GRPO steps in a row with a skipped (NaN/inf) optimizer step; raises at ``max_in_a_row``."""

    def __init__(self, max_in_a_row: int) -> None:
        self.max_in_a_row = max_in_a_row
        self.in_a_row = 0

    def check(self, step: int, metrics: dict[str, float]) -> None:
        self.in_a_row = self.in_a_row + 1 if metrics.get("nonfinite_steps", 0) else 0
        if self.in_a_row >= self.max_in_a_row:
            raise RuntimeError(
                f"GRPO step {step}: the loss or the gradients were NaN/inf in {self.in_a_row} steps in a row "
                f"(their optimizer steps were skipped; last loss {metrics.get('loss')}, grad_norm "
                f"{metrics.get('grad_norm')}). Likely causes: a learning rate too high, fp16 overflow (try "
                "bf16), or NaN weights or inputs; raise GRPOConfig.max_nonfinite_steps to go on"
            )


class RunInterrupted(KeyboardInterrupt):
    """A stop signal that ended a run at once: outside a step loop (loading, the cold start, an evaluation),
    where nothing would be lost by stopping, or a second signal. ``signal`` names it (SIGTERM, SIGINT)."""

    def __init__(self, signal_name: str, message: str | None = None) -> None:
        super().__init__(message or f"stopped by {signal_name}")
        self.signal = signal_name


class StopSignals:
    """SIGTERM and SIGINT (a preempted job, Ctrl-C) within ``with``; the previous handlers come back after.

    Outside ``deferred()`` the first signal raises :class:`RunInterrupted` at once (loading, an evaluation:
    nothing is lost). Inside it (the step loop, a checkpoint write, the final save) a signal only sets a
    flag, read at step boundaries (``stop_here``) and by the caller after the block, so a step, a checkpoint
    or the final save is never cut; a second signal stops at once (``RunInterrupted``, no checkpoint).
    ``agree`` combines the flag over processes (any process signalled: all stop at the same step), default
    this process's own. A signal the process ignores (SIGINT under ``nohup``) stays ignored.

    One is active per process at a time: ``StopSignals.current()``; the trainer joins the command line's.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)
    _current: StopSignals | None = None

    def __init__(self, agree: Callable[[bool], bool] | None = None) -> None:
        self.agree = agree or (lambda flag: flag)
        self.received: str | None = None
        self.deferring = 0
        self._previous: dict[int, Any] = {}

    @classmethod
    def in_force(cls) -> contextlib.AbstractContextManager[StopSignals]:
        """The handlers in force (a caller's ``with`` block), joined; else new ones for a ``with`` block."""
        current = cls._current
        return contextlib.nullcontext(current) if current is not None else cls()

    @classmethod
    def current(cls) -> StopSignals | None:
        """The handlers in force in this process (a ``with`` block that is running), or None."""
        return cls._current

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # handlers only install there
            for sig in self.SIGNALS:
                if signal.getsignal(sig) is signal.SIG_IGN:  # ignored by whoever started us: kept so
                    continue
                self._previous[sig] = signal.signal(sig, self._note)
            self._outer, StopSignals._current = StopSignals._current, self
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self._previous or StopSignals._current is self:
            StopSignals._current = getattr(self, "_outer", None)
        self._previous.clear()

    @contextlib.contextmanager
    def deferred(self, agree: Callable[[bool], bool] | None = None) -> Iterator[StopSignals]:
        """Within the block a first signal is only noted (``agree``: how processes combine the flag)."""
        previous_agree = self.agree
        self.agree = agree or self.agree
        self.deferring += 1
        try:
            yield self
        finally:
            self.deferring -= 1
            self.agree = previous_agree

    def _note(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:  # a second signal (Ctrl-C twice): stop now, without a checkpoint
            raise RunInterrupted(name, f"{name} again: stopped without a checkpoint")
        self.received = name
        if not self.deferring:
            raise RunInterrupted(name)

    def requested(self) -> bool:
        """Whether any process received a stop signal (a collective when ``agree`` is one)."""
        return self.agree(self.received is not None)

    def stop_here(self, step: int, save_checkpoint: Callable[[], Any], *, announce: bool) -> str | None:
        """At a step boundary: when a stop signal reached a process, save a checkpoint, say how to resume
        (``announce``: the main process) and return the signal's name; else None."""
        if not self.requested():
            return None
        stopped_by = self.received or "a signal to another process"
        path = save_checkpoint()
        if announce:
            print(
                f"grpokit: stopped by {stopped_by} after step {step}; checkpoint in {path}; continue with "
                "resume_from_checkpoint=latest",
                flush=True,
            )
        return stopped_by
