"""A vision-language policy on two CPU processes (gloo) under every placement (DDP, FSDP2, ZeRO-2, ZeRO-3;
DDP in bf16; LoRA under DDP and ZeRO-3): at learning rate 0 (mu 2,
beta 0.04) the ratio is exactly 1, the KL exactly 0 and no token clipped, with each process's rows carrying
their own prompts' images through the old-policy, reference and update passes (_two_process_worker.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpokit.models.tiny_vision import build_tiny_vlm

from ..train.test_multiprocess import run_two_processes
from ._two_process_worker import CELLS, LAUNCHES

WORKER = Path(__file__).with_name("_two_process_worker.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    model, processor = build_tiny_vlm("llava", seed=0)
    policy = tmp_path_factory.mktemp("llava")
    model.save_pretrained(policy)
    processor.save_pretrained(policy)
    out = tmp_path_factory.mktemp("placements")
    for launch in range(len(LAUNCHES)):
        run_two_processes(WORKER, str(policy), str(out), str(launch), timeout=1200)
    return out


@pytest.mark.parametrize("placement", CELLS)
def test_learning_rate_zero_keeps_ratio_one_and_kl_zero_on_two_processes(runs, placement):
    for rank in (0, 1):
        record = json.loads((runs / f"{placement}-rank{rank}.json").read_text())
        assert record["num_processes"] == 2
        assert len(record["history"]) == 2
        for entry in record["history"]:
            assert entry["kl"] == 0.0, (placement, entry)
            assert entry["clip_ratio/region_mean"] == 0.0, (placement, entry)
