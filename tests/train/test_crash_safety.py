"""Crash-safe runs, with real processes and signals: SIGTERM (a preempted job) or SIGINT (Ctrl-C) saves a
checkpoint at the next step boundary and exits 0 saying how to resume; after kill -9 at any moment, a
resume from the latest checkpoint ends with the weights of an uninterrupted run, bit for bit, and the logs
hold each step once; a checkpoint cut off mid-write is never the latest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from grpokit.parallel import checkpoint

WORKER = Path(__file__).with_name("_crash_worker.py")
STEPS = 5


def start(policy_dir, out: Path, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, str(WORKER), str(policy_dir), str(out), str(STEPS), *extra]
    return subprocess.Popen(  # SIGINT restored: a suite started in the background (nohup) ignores it
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def wait_for_checkpoint(out: Path, step: int, process: subprocess.Popen, limit: float = 900.0) -> None:
    deadline = time.monotonic() + limit
    while not (checkpoint.checkpoint_dir(out, step) / checkpoint.STATE_FILE).exists():
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.05)


def steps_logged(out: Path, name: str) -> list[int]:
    return [json.loads(line)["step"] for line in (out / name).read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tmp_path_factory) -> dict[str, torch.Tensor]:
    out = tmp_path_factory.mktemp("uninterrupted")
    process = start(tiny_model_dir, out)
    assert process.wait(timeout=900) == 0, process.communicate()[1][-3000:]
    return torch.load(out / "weights.pt")


def assert_same_weights(out: Path, expected: dict[str, torch.Tensor]) -> None:
    got = torch.load(out / "weights.pt")
    assert set(got) == set(expected)
    assert all(torch.equal(got[k], v) for k, v in expected.items())  # bit for bit


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_checkpoints_and_exits_cleanly(tiny_model_dir, tmp_path, uninterrupted, sig):
    process = start(tiny_model_dir, tmp_path)
    wait_for_checkpoint(tmp_path, 2, process)
    process.send_signal(sig)
    stdout, stderr = process.communicate(timeout=900)
    assert process.returncode == 0, stderr[-3000:]
    assert f"stopped by {sig.name} after step" in stdout and "resume_from_checkpoint=latest" in stdout
    stopped = checkpoint.latest_checkpoint(tmp_path)
    assert stopped is not None and int(stopped.name.split("-")[1]) < STEPS
    resumed = start(tiny_model_dir, tmp_path, "resume")
    assert resumed.wait(timeout=900) == 0, resumed.communicate()[1][-3000:]
    assert_same_weights(tmp_path, uninterrupted)
    assert steps_logged(tmp_path, "metrics.jsonl") == list(range(1, STEPS + 1))


def test_kill_9_then_resume_is_exact_and_logs_each_step_once(tiny_model_dir, tmp_path, uninterrupted):
    process = start(tiny_model_dir, tmp_path)
    wait_for_checkpoint(tmp_path, 2, process)
    time.sleep(0.4)  # somewhere inside step 3 or 4
    process.kill()
    process.wait(timeout=60)
    resumed = start(tiny_model_dir, tmp_path, "resume")
    assert resumed.wait(timeout=900) == 0, resumed.communicate()[1][-3000:]
    assert_same_weights(tmp_path, uninterrupted)
    assert steps_logged(tmp_path, "metrics.jsonl") == list(range(1, STEPS + 1))
    completions = steps_logged(tmp_path, "completions.jsonl")
    assert sorted(set(completions)) == list(range(1, STEPS + 1))
    assert all(completions.count(step) == 8 for step in range(1, STEPS + 1))  # 2 prompts x G=4 each, once


@pytest.mark.parametrize("mode", ["selfplay", "pool"])
def test_kill_9_during_self_play_resumes_to_the_uninterrupted_result(tiny_model_dir, tmp_path_factory, mode):
    """A game against itself (or against a pool of its snapshots) with role baselines (RAE): the weights,
    the baselines and the snapshots after a kill -9 and a resume equal an uninterrupted run's, bit for
    bit."""
    whole = tmp_path_factory.mktemp(f"{mode}-whole")
    process = start(tiny_model_dir, whole, mode)
    assert process.wait(timeout=900) == 0, process.communicate()[1][-3000:]
    cut = tmp_path_factory.mktemp(f"{mode}-cut")
    process = start(tiny_model_dir, cut, mode)
    wait_for_checkpoint(cut, 2, process)
    time.sleep(0.4)  # somewhere inside step 3 or 4
    process.kill()
    process.wait(timeout=60)
    resumed = start(tiny_model_dir, cut, mode, "resume")
    assert resumed.wait(timeout=900) == 0, resumed.communicate()[1][-3000:]
    assert_same_weights(cut, torch.load(whole / "weights.pt"))
    baselines = json.loads((whole / "baselines.json").read_text())
    assert json.loads((cut / "baselines.json").read_text()) == baselines
    assert set(baselines["baselines"]) == {"Dialogue/first", "Dialogue/second"}
    assert steps_logged(cut, "metrics.jsonl") == list(range(1, STEPS + 1))
    if mode == "pool":
        expected, got = torch.load(whole / "pool.pt"), torch.load(cut / "pool.pt")
        assert [step for step, _ in got] == [step for step, _ in expected] == [2, 4]
        assert all(torch.equal(a[k], b[k]) for (_, a), (_, b) in zip(got, expected) for k in a)


def test_a_checkpoint_cut_off_mid_write_is_never_the_latest(tmp_path):
    complete = checkpoint.checkpoint_dir(tmp_path, 2)
    complete.mkdir(parents=True)
    (complete / checkpoint.STATE_FILE).write_text("{}")
    (tmp_path / "checkpoint-3.tmp").mkdir()  # killed while writing: never renamed
    (tmp_path / "checkpoint-4").mkdir()  # a directory without its state file
    assert checkpoint.latest_checkpoint(tmp_path) == complete


def test_a_second_signal_stops_at_once():
    from grpokit.parallel.stopping import RunInterrupted, StopSignals

    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as signals, signals.deferred():
        signals._note(signal.SIGTERM, None)
        assert signals.requested() and signals.received == "SIGTERM"
        with pytest.raises(RunInterrupted, match="SIGTERM again"):
            signals._note(signal.SIGTERM, None)
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back


def test_outside_the_step_loop_a_signal_stops_at_once_and_an_ignored_one_stays_ignored():
    """Loading or evaluating, nothing is lost by stopping: the first signal raises RunInterrupted (a
    KeyboardInterrupt). A signal the process ignores (SIGINT under nohup) is left ignored."""
    from grpokit.parallel.stopping import RunInterrupted, StopSignals

    with StopSignals() as signals:
        assert StopSignals.current() is signals
        with pytest.raises(RunInterrupted, match="stopped by SIGTERM") as caught:
            signals._note(signal.SIGTERM, None)
        assert isinstance(caught.value, KeyboardInterrupt) and caught.value.signal == "SIGTERM"
    assert StopSignals.current() is None
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with StopSignals():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, previous)
