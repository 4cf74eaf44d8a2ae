"""Environment calls under a time limit: results, raised errors and hung calls are reported per call, and a
hung call never keeps the process from exiting."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from grpokit.envs.bounded import BoundedCaller, EnvironmentTimeout


def test_results_errors_and_hangs_are_reported_per_call():
    caller = BoundedCaller(timeout=0.2, max_workers=2)
    start = time.monotonic()
    out = caller.run([lambda: 1, lambda: 1 / 0, lambda: time.sleep(120), lambda: "x"])
    assert time.monotonic() - start < 60  # the 0.2 s limit, not the 120 s call
    assert out[0] == 1 and isinstance(out[1], ZeroDivisionError) and out[3] == "x"
    assert isinstance(out[2], EnvironmentTimeout)
    assert caller.run([lambda: 2]) == [2]  # fresh workers after a hang
    assert BoundedCaller(timeout=None).run([lambda: 3, lambda: 1 / 0])[0] == 3  # inline, in order
    with pytest.raises(ValueError, match="environment_timeout must be > 0"):
        BoundedCaller(timeout=0)


def test_a_hung_call_does_not_keep_the_process_alive():
    code = (
        "import time\n"
        "from grpokit.envs.bounded import BoundedCaller\n"
        "print(type(BoundedCaller(0.2).run([lambda: time.sleep(3600)])[0]).__name__)\n"
    )
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "EnvironmentTimeout"
    assert time.monotonic() - start < 300  # exits at once (only the interpreter's start-up counts)
