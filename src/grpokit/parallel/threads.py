"""How many threads torch's CPU operations use, when other work shares the cores.

torch's CPU kernels run on OpenMP threads, one per core by default, and OpenMP threads spin while they wait
at a barrier. When another job is busy on the same cores, two jobs of 2 threads on 2 cores oversubscribe
them and each spins on cores the other needs: measured on the project's 2-core machine (the default recipe,
median s/step over steps 6-30), 0.234 s/step alone, 0.74 with a second such job (3.2x slower, where a fair
share is 2x), 0.39 with 1 thread each (1.7x); ``OMP_WAIT_POLICY=PASSIVE`` gave 0.42 paired but 0.41 alone
(not spinning costs the tiny model's many short kernels more than it saves).

So the policy (``GRPOConfig.torch_num_threads=None``, the default) is to use no more threads than the cores
other processes leave idle: measured when the trainer starts (over 0.25 s) and again over every step
(Linux ``/proc/stat``, minus this process's own CPU time), shared among this machine's processes
(``LOCAL_WORLD_SIZE``), never more than torch had when the trainer started. A run alone keeps every core; a
run joined by another job steps down to its share and back up when the job ends. An explicit
``torch_num_threads`` fixes the count (choose one for numbers reproducible whatever the machine's load).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

__all__ = ["ThreadPolicy", "idle_cores_between"]

logger = logging.getLogger(__name__)

Reading = tuple[int, int, float]
"""(busy jiffies, total jiffies, this process's CPU seconds)."""


def _reading() -> Reading | None:
    """All cores' busy and total jiffies (``/proc/stat``) and this process's CPU seconds; None off Linux."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    values = [
        int(v) for v in fields[1:9]
    ]  # user nice system idle iowait irq softirq steal (guest is in user)
    times = os.times()
    return sum(values) - values[3] - values[4], sum(values), times.user + times.system


def idle_cores_between(before: Reading, after: Reading, cores: int, clock_ticks: int) -> float:
    """Cores that processes other than this one left idle between two readings:
    cores - (busy seconds of all processes - this process's CPU seconds) / wall seconds."""
    wall = (after[1] - before[1]) / clock_ticks / max(cores, 1)  # total jiffies cover every core
    if wall <= 0:
        return float(cores)
    others = max(0.0, (after[0] - before[0]) / clock_ticks - (after[2] - before[2]))
    return max(0.0, cores - others / wall)


class ThreadPolicy:
    """Keeps torch's CPU thread count at this process's share of the idle cores (see the module docstring)."""

    def __init__(self, requested: int | None, local_processes: int = 1) -> None:
        self.ceiling = torch.get_num_threads()
        self.local_processes = max(local_processes, 1)
        self.last = _reading()
        self.adaptive = requested is None and self.ceiling > 1 and self.last is not None
        if requested:
            self._set(requested, "torch_num_threads")
        if self.adaptive:
            time.sleep(0.25)  # a first look at the machine before the first step
            self.after_step()

    @classmethod
    def for_run(cls, args: object, *, cpu: bool) -> ThreadPolicy | None:
        """The policy of a CPU run (None on accelerators: their kernels do not run on these threads)."""
        if not cpu:
            return None
        return cls(getattr(args, "torch_num_threads", None), int(os.environ.get("LOCAL_WORLD_SIZE", "1")))

    def after_step(self) -> None:
        """Re-measure the idle cores since the last call and set the thread count for what comes next."""
        if not self.adaptive:
            return
        now = _reading()
        if now is None or self.last is None:
            return
        cores = os.cpu_count() or 1
        idle = idle_cores_between(self.last, now, cores, os.sysconf("SC_CLK_TCK"))
        if hasattr(os, "sched_getaffinity"):
            idle = min(idle, float(len(os.sched_getaffinity(0))))
        self.last = now
        share = max(1, min(self.ceiling, int(idle + 0.5) // self.local_processes))
        if share != torch.get_num_threads():
            self._set(share, f"{idle:.1f} idle core(s) for {self.local_processes} local process(es)")

    @staticmethod
    def _set(threads: int, why: str) -> None:
        logger.info("grpokit: torch CPU threads %d -> %d (%s)", torch.get_num_threads(), threads, why)
        torch.set_num_threads(threads)
