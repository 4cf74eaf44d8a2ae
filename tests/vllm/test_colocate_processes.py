"""Colocate mode over two training processes, as TRL runs it: ``torchrun`` starts two CPU processes (gloo),
each builds its own engine with vLLM's external launcher, and each engine gets its process's weights once
per step. After two steps both policies are equal (DDP) and each engine's greedy completions are its
policy's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: .ci/run's second stage runs tests/vllm")
pytestmark = pytest.mark.vllm

WORKER = Path(__file__).with_name("_two_process_worker.py")
ROOT = Path(__file__).parents[2]


def test_two_training_processes_each_with_its_engine(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo"}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    launcher += ["--log-dir", str(tmp_path / "torchrun")]  # (not a torchelastic_* left in the system's temp)
    result = subprocess.run(
        [*launcher, str(WORKER), str(tmp_path)], env=env, capture_output=True, text=True, timeout=400
    )
    assert result.returncode == 0, result.stderr[-6000:]
    assert "Traceback" not in result.stderr.split("Chat template warmup failed")[-1]  # a clean shutdown too
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in (0, 1)]
    assert [r["num_processes"] for r in ranks] == [2, 2]
    assert ranks[0]["param_checksum"] == pytest.approx(ranks[1]["param_checksum"], rel=1e-6)
    for rank in ranks:
        assert rank["pushes"] == 1 + 2  # the first generation, then one per update
        assert rank["engine_greedy"] == rank["policy_greedy"]
        assert all(m["time/weight_push"] > 0 for m in rank["history"])
