"""Dynamic sampling on two CPU processes: every process trains on the same number of groups, the first
informative ones in process order, even when they were sampled on the other process."""

from __future__ import annotations

import json
from pathlib import Path

from .test_multiprocess import run_two_processes

WORKER = Path(__file__).with_name("_dynamic_sampling_worker.py")


def test_two_processes_train_on_equal_shares_of_the_informative_groups(tiny_model_dir, tmp_path):
    run_two_processes(WORKER, str(tiny_model_dir), str(tmp_path))
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in (0, 1)]
    # round 1: p0 rows 0, 1 (informative), p1 rows 2, 3 (flat): 2 of 4 found at a rate of 1/2, so round 2
    # samples 2 / (1/2) = 4 prompts: p0 rows 4, 5 (5 flat), p1 rows 6, 7. Process-major order of the groups:
    # p0 [0, 1, 4, 5], p1 [2, 3, 6, 7]; informative: 0, 1, 4, 6, 7; the first 4 are kept, 2 per process:
    # p0 trains on 0, 1 and p1 on 4 (sampled by p0) and 6
    assert ranks[0]["trained"] == [["0+0="] * 4 + ["1+0="] * 4]
    assert ranks[1]["trained"] == [["4+0="] * 4 + ["6+0="] * 4]
    for rank in ranks:
        metrics = rank["metrics"]
        assert metrics["dynamic_sampling/rounds"] == 2 and metrics["dynamic_sampling/kept_groups"] == 4
        assert metrics["dynamic_sampling/dropped_groups"] == 4  # 3 flat + 1 informative beyond the batch
    assert ranks[0]["checksum"] == ranks[1]["checksum"]  # one model, updated from all four groups
