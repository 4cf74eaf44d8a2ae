"""SIGTERM at a random moment of a short ``grpokit train`` run, 20 times: each time the folder holds a
finished run, a checkpoint that ``resume_from_checkpoint=latest`` continues, or nothing trained (the same
command starts again), the closing line says which, and the run, completed that way, ends with the
uninterrupted run's final weights bit for bit. The runs happen in one worker process
(``_interrupt_worker.py``), each signalled by a timer at a delay drawn uniformly over an uninterrupted run's
duration."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("_interrupt_worker.py")
TRIALS = 20


def test_a_signal_at_any_moment_leaves_a_finished_or_resumable_run(tiny_model_dir, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    env = {k: v for k, v in env.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    done = subprocess.run(
        [sys.executable, str(WORKER), str(tiny_model_dir), str(tmp_path), str(TRIALS), "0"],
        capture_output=True, text=True, env=env, timeout=1800,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    trials = report["trials"]
    assert len(trials) == TRIALS
    for trial in trials:
        assert trial["same_weights"], trial
        closing = trial["closing"][0] if trial["closing"] else ""
        if trial["left"] == "checkpoint":
            assert "resume_from_checkpoint=latest" in closing and "no final model yet" in closing, trial
        elif trial["left"] == "nothing":
            assert "nothing was trained" in closing and "start again with: grpokit train" in closing, trial
        else:  # finished: uninterrupted (the timer came after the end) or stopped after the final save
            assert "the run finished first" in closing or "done in" in closing, trial
        assert trial["state"] == "finished"  # once completed
    assert {t["left"] for t in trials} >= {"finished", "checkpoint"}  # the draws covered both
