"""GRPO on two CPU processes (torchrun, gloo): prompts are split, parameters stay identical, the log
describes the whole batch; and the rules that merge per-process metrics."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from grpokit.parallel.distributed import make_accelerator, merge_process_metrics, needs_cpu_processes

SELFPLAY_WORKER = Path(__file__).with_name("_selfplay_worker.py")
WORKER = Path(__file__).with_name("_two_process_worker.py")
RESUME_WORKER = Path(__file__).with_name("_two_process_resume_worker.py")


def test_merge_rules_on_hand_made_metrics():
    rank0 = {
        "loss": 0.2,
        "completions/min_length": 3.0,
        "completions/max_length": 9.0,
        "rewards/acc/failures": 1.0,
        "time/step": 1.5,
        "tokens_per_second": 100.0,
        "kl": math.nan,
    }
    rank1 = {
        "loss": 0.4,
        "completions/min_length": 2.0,
        "completions/max_length": 7.0,
        "rewards/acc/failures": 2.0,
        "time/step": 2.5,
        "tokens_per_second": 50.0,
        "kl": 0.1,
        "only_here": 5.0,
    }
    merged = merge_process_metrics([rank0, rank1])
    assert merged == pytest.approx(
        {
            "loss": 0.3,
            "completions/min_length": 2.0,
            "completions/max_length": 9.0,
            "rewards/acc/failures": 3.0,
            "time/step": 2.5,
            "tokens_per_second": 150.0,
            "kl": 0.1,
            "only_here": 5.0,
        }
    )
    assert list(merged)[:2] == ["loss", "completions/min_length"]
    assert math.isnan(merge_process_metrics([{"kl": math.nan}, {"kl": math.nan}])["kl"])


def test_cpu_processes_only_for_a_multi_process_launch(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not needs_cpu_processes()
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert needs_cpu_processes() is (not __import__("torch").accelerator.is_available())


def test_a_later_trainer_may_change_precision_in_one_process():
    """accelerate refuses a second precision in one process; grpokit resets its state when single-process."""
    assert make_accelerator("no", use_cpu=False).mixed_precision == "no"
    assert make_accelerator("bf16", use_cpu=False).mixed_precision == "bf16"
    assert make_accelerator("no", use_cpu=False).mixed_precision == "no"


def run_two_processes(worker: Path, *args: str, extra: tuple[str, ...] = (), timeout: float = 900) -> None:
    """``torchrun --standalone --nproc_per_node 2 worker args`` on CPU processes (gloo over loopback);
    ``timeout``: many times a launch's duration on an idle machine (a loaded one is slower)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    env["OMP_NUM_THREADS"] = "1"
    if sys.platform.startswith("linux"):  # loopback: no dependence on the host name resolving
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    with tempfile.TemporaryDirectory(prefix="grpokit-torchrun-") as logs:  # torchrun's log folders, removed
        command = [*launcher, "--log-dir", logs, *extra, str(worker), *args]  # (else one per launch is left)
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]


def test_two_processes_resume_exactly_each_from_its_own_rng_state(tiny_model_dir, tmp_path):
    """The processes sample with different random streams; a resumed run restores each process's own
    state, so its parameters and its logged completions equal the uninterrupted run's."""
    run_two_processes(RESUME_WORKER, str(tiny_model_dir), str(tmp_path))
    ranks = [json.loads((tmp_path / f"resume-rank{k}.json").read_text()) for k in (0, 1)]
    for rank in ranks:
        assert rank["step"] == 3
        assert rank["resumed"] == pytest.approx(rank["straight"], rel=1e-6)

    def completions(run):
        lines = (tmp_path / run / "completions.jsonl").read_text().splitlines()
        return [json.loads(line)["completion"] for line in lines if json.loads(line)["step"] == 3]

    step3 = completions("straight")
    assert len(step3) == 16 and step3 == completions("split")


def test_two_processes_sample_the_same_when_finished_rows_leave(tiny_model_dir, tmp_path):
    """The fast sampler's compaction (finished rows leave the decode batch) against decoding every row, on
    two processes: the same completions on each and the same weights after two steps."""
    for decode in ("compact", "whole"):
        (tmp_path / decode).mkdir()
        run_two_processes(WORKER, str(tiny_model_dir), str(tmp_path / decode), decode)
    runs = {
        decode: [json.loads((tmp_path / decode / f"rank{k}.json").read_text()) for k in (0, 1)]
        for decode in ("compact", "whole")
    }
    for compact, whole in zip(runs["compact"], runs["whole"]):
        assert compact["param_checksum"] == pytest.approx(whole["param_checksum"], rel=1e-6)
        for a, b in zip(compact["decoded"], whole["decoded"]):
            assert b["decoded_rows"] == b["rows"] * b["decode_steps"]
            assert a["decode_steps"] == b["decode_steps"] and a["decoded_rows"] <= b["decoded_rows"]
    fewer = [a["decoded_rows"] < b["decoded_rows"] for r in (0, 1)
             for a, b in zip(runs["compact"][r]["decoded"], runs["whole"][r]["decoded"])]  # fmt: skip
    assert any(fewer)  # rows did leave

    def completions(decode: str) -> list[tuple]:
        lines = (tmp_path / decode / "run" / "completions.jsonl").read_text().splitlines()
        return [(r["step"], r["prompt"], r["completion"]) for r in map(json.loads, lines)]

    assert completions("compact") == completions("whole")


def test_two_processes_train_as_one_batch(tiny_model_dir, tmp_path):
    run_two_processes(WORKER, str(tiny_model_dir), str(tmp_path))
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in (0, 1)]
    assert [r["num_processes"] for r in ranks] == [2, 2]
    for step in range(2):  # each step's 4 prompts are split into two disjoint shares of 2
        share0, share1 = ranks[0]["prompts"][step], ranks[1]["prompts"][step]
        assert len(share0) == len(share1) == 2 and not set(share0) & set(share1)
    # DDP: the same gradient everywhere, so the same parameters after the updates
    assert ranks[0]["param_checksum"] == pytest.approx(ranks[1]["param_checksum"], rel=1e-6)
    # merged metrics: identical on both processes, for the whole batch of 16 completions per step
    assert ranks[0]["history"] == ranks[1]["history"]
    last = ranks[0]["history"][-1]
    assert last["step"] == 2 and last["completions/max_length"] <= 6
    assert "eval/reward" in last  # eval rows split over the processes, then gathered (equal on both)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2  # written by the main process only
    logged = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    for step in (1, 2):  # the whole batch: both processes' prompts, G=4 completions each, in process order
        prompts = [r["prompt"] for r in logged if r["step"] == step]
        shares = ranks[0]["prompts"][step - 1] + ranks[1]["prompts"][step - 1]
        assert prompts == [p for p in shares for _ in range(4)]


def test_two_processes_play_their_share_of_the_games_with_the_same_role_baselines(tiny_model_dir, tmp_path):
    """Self-play on two processes: each plays its share of the deals; SPIRAL's role baselines are read and
    updated over every process's episodes in one order, so both hold the same baselines, and they equal
    the baselines replayed by hand from the logged returns; the parameters stay identical."""
    import torch

    from grpokit.core import RoleBaselines

    run_two_processes(SELFPLAY_WORKER, str(tiny_model_dir), str(tmp_path))
    ranks = [json.loads((tmp_path / f"selfplay-rank{k}.json").read_text()) for k in (0, 1)]
    assert ranks[0]["param_checksum"] == pytest.approx(ranks[1]["param_checksum"], rel=1e-6)
    assert ranks[0]["history"] == ranks[1]["history"] and ranks[0]["baselines"] == ranks[1]["baselines"]
    logged = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    replay = RoleBaselines(alpha=0.5)
    for step in (1, 2):  # 2 deals per process, 4 seats each, role-major: the whole batch in process order
        rewards = [r["reward"] for r in logged if r["step"] == step]
        assert len(rewards) == 16
        keys = [f"Dialogue/{'first' if i % 4 < 2 else 'second'}" for i in range(16)]
        replay.advantages(keys, torch.tensor(rewards, dtype=torch.float32))
    assert ranks[0]["baselines"]["baselines"] == pytest.approx(replay.baselines)
    assert "selfplay/return/first" in ranks[0]["history"][-1]


def test_two_processes_resume_self_play_against_the_pool_exactly(tiny_model_dir, tmp_path):
    """Against a pool of snapshots with role baselines on two processes: 2 steps, a checkpoint and a resumed
    third end where 3 straight steps end (parameters, snapshots, baselines), on both processes."""
    run_two_processes(SELFPLAY_WORKER, str(tiny_model_dir), str(tmp_path), "resume")
    ranks = [json.loads((tmp_path / f"selfplay-resume-rank{k}.json").read_text()) for k in (0, 1)]
    for rank in ranks:
        assert rank["resumed"]["step"] == 3 and rank["resumed"]["pool"] == rank["straight"]["pool"] == [2, 3]
        assert rank["resumed"]["checksum"] == pytest.approx(rank["straight"]["checksum"], rel=1e-6)
        assert rank["resumed"]["pool_checksum"] == pytest.approx(rank["straight"]["pool_checksum"], rel=1e-6)
        resumed, straight = rank["resumed"]["baselines"], rank["straight"]["baselines"]
        assert resumed["baselines"] == pytest.approx(straight["baselines"])
    assert ranks[0]["resumed"] == ranks[1]["resumed"]
