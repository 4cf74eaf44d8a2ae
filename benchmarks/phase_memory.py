"""Peak resident memory of each phase of grpokit's GRPO step, on a benchmark workload.

Runs ``side_grpokit.py --impl trainer`` in this process with ``PhaseTimer.phase`` wrapped: before each phase
the kernel's high-water mark is reset (``/proc/self/clear_refs``, Linux), after it the phase's peak
(``VmHWM``) is printed with the resident size before and after. What the process holds before its first
update (weights, the reference model, the runtime), what the first update adds for good (gradients, AdamW's
moments) and what each update's activations add on top can be read off.

    python benchmarks/phase_memory.py --workload W4 [--steps 1] [any other side_grpokit.py option]

needs the model directory of that workload (``run.sh`` makes it: ``/tmp/grpokit-bench/smollm2``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _status(field: str) -> int:
    """A ``/proc/self/status`` size in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) // 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def main() -> None:
    import side_grpokit

    import grpokit.reporting.metrics as metrics

    timed = metrics.PhaseTimer.phase

    @contextlib.contextmanager
    def phase(self, name: str):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current resident size
        before = _status("VmRSS")
        with timed(self, name):
            yield
        peak, after = _status("VmHWM"), _status("VmRSS")
        print(f"{name:14s} before {before:6d}   peak {peak:6d}   after {after:6d} MiB", flush=True)

    metrics.PhaseTimer.phase = phase
    defaults = ["--impl", "trainer", "--steps", "1", "--warmup", "1"]
    defaults += ["--model", os.path.join(tempfile.gettempdir(), "grpokit-bench", "smollm2")]
    defaults += ["--out", os.path.join(tempfile.mkdtemp(prefix="phase-memory-"), "result.json")]
    sys.argv = [sys.argv[0], *defaults, *sys.argv[1:]]  # later options win
    side_grpokit.main()


if __name__ == "__main__":
    main()
