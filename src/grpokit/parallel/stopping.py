"""What stops a run early, and how: NaN/inf steps in a row (an error saying what to check), and SIGTERM or
SIGINT (a preempted job, Ctrl-C: the current step finishes, a checkpoint is saved, the run ends cleanly)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["NonfiniteGuard", "StopSignals"]


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


class StopSignals:
    """Within ``with``: SIGTERM and SIGINT only set a flag (the previous handlers come back after); a
    second one stops at once (``KeyboardInterrupt``, no checkpoint).
    ``requested()`` is read at step boundaries; ``agree`` combines the flag over processes (any process
    signalled: all stop at the same step), default this process's own."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, agree: Callable[[bool], bool] | None = None) -> None:
        self.agree = agree or (lambda flag: flag)
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # handlers only install there
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:  # a second signal (Ctrl-C twice): stop now, without a checkpoint
            self.__exit__()
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} again: stopped without a checkpoint")
        self.received = signal.Signals(signum).name

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
