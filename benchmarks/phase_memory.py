"""Peak resident memory of each phase of grpokit's GRPO step, on a benchmark workload.

Runs ``side_grpokit.py --impl trainer`` in this process with ``PhaseTimer.phase`` wrapped: before each phase
the kernel's high-water mark is reset (``/proc/self/clear_refs``, Linux), after it the phase's peak
(``VmHWM``) is printed with the resident size before and after. What the process holds before its first
update (weights, the reference model, the runtime), what the first update adds for good (gradients, AdamW's
moments) and what each update's activations add on top can be read off.

With glibc, each line also gives what the C allocator (which holds every CPU tensor) had handed out at the
phase's peak ("live", sampled every 20 ms) and the size of its heap afterwards ("heap", in-use plus free).
The resident size is the heap plus what is not in it (the libraries, weights mapped from their file); a
heap larger than the live peak is memory the allocator could not reuse, at the places the step freed it.

    python benchmarks/phase_memory.py --workload W4 [--steps 1] [any other side_grpokit.py option]

needs the model directory of that workload (``run.sh`` makes it: ``/tmp/grpokit-bench/smollm2``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _status(field: str) -> int:
    """A ``/proc/self/status`` size in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) // 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (malloc.h, glibc >= 2.33): sizes in bytes, over every arena."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                     "fordblks", "keepcost")
    ]  # fmt: skip


class _Allocator:
    """The C allocator's bytes in use (``uordblks`` + ``hblkhd``: heap blocks and mapped blocks handed out)
    and its heap (``arena`` + ``hblkhd``), with a thread keeping the highest in-use value seen since
    ``reset``. ``available`` is False off glibc, and where another allocator serves ``malloc``."""

    def __init__(self) -> None:
        from grpokit.parallel.cpu_runtime import preloaded_allocator

        self.available = False
        if preloaded_allocator() is not None:
            return
        try:
            self._mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
        except (OSError, AttributeError):
            return
        self._mallinfo2.restype = _MallInfo2
        self.available, self.peak, self._lock = True, 0, threading.Lock()
        threading.Thread(target=self._watch, daemon=True).start()

    def sizes(self) -> tuple[int, int]:
        info = self._mallinfo2()
        return info.uordblks + info.hblkhd, info.arena + info.hblkhd

    def reset(self) -> None:
        with self._lock:
            self.peak = self.sizes()[0]

    def _watch(self) -> None:
        while True:
            with self._lock:  # (a value read before a reset must not land after it)
                self.peak = max(self.peak, self.sizes()[0])
            time.sleep(0.02)  # (each look takes the allocator's lock: the phases' times are not step times)


def main() -> None:
    import side_grpokit

    import grpokit.reporting.metrics as metrics

    timed = metrics.PhaseTimer.phase
    allocator = _Allocator()

    @contextlib.contextmanager
    def phase(self, name: str):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current resident size
        before = _status("VmRSS")
        if allocator.available:
            allocator.reset()
        with timed(self, name):
            yield
        peak, after = _status("VmHWM"), _status("VmRSS")
        line = f"{name:14s} before {before:6d}   peak {peak:6d}   after {after:6d} MiB"
        if allocator.available:
            heap = allocator.sizes()[1]
            line += f"   (live peak {allocator.peak >> 20:6d}, heap {heap >> 20:6d} MiB)"
        print(line, flush=True)

    metrics.PhaseTimer.phase = phase
    defaults = ["--impl", "trainer", "--steps", "1", "--warmup", "1"]
    defaults += ["--model", os.path.join(tempfile.gettempdir(), "grpokit-bench", "smollm2")]
    with tempfile.TemporaryDirectory(prefix="phase-memory-") as scratch:  # the side's result: not kept
        defaults += ["--out", os.path.join(scratch, "result.json")]
        sys.argv = [sys.argv[0], *defaults, *sys.argv[1:]]  # later options win
        side_grpokit.main()


if __name__ == "__main__":
    main()
