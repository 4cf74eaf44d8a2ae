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
    # process-major order of the sampled groups: p0 [0, 1, 4, 5], p1 [2, 3, 6, 7]; informative (not 3, 4):
    # 0, 1, 5, 2, 6, 7; the first 4 are kept: p0 trains on 0, 1 and p1 on 5 (sampled by p0) and 2
    assert ranks[0]["trained"] == [["0+0="] * 4 + ["1+0="] * 4]
    assert ranks[1]["trained"] == [["5+0="] * 4 + ["2+0="] * 4]
    for rank in ranks:
        metrics = rank["metrics"]
        assert metrics["dynamic_sampling/rounds"] == 2 and metrics["dynamic_sampling/kept_groups"] == 4
        assert metrics["dynamic_sampling/dropped_groups"] == 4  # 2 flat + 2 informative beyond the batch
    assert ranks[0]["checksum"] == ranks[1]["checksum"]  # one model, updated from all four groups
