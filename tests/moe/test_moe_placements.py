"""Mixture-of-experts cells of the placement matrix (``_moe_worker.py``): a tiny Qwen3-MoE with close router
logits, one step at learning rate 0 with routing replay R3 and the real fast sampler, in one process and on
two CPU processes under DDP, FSDP2, ZeRO-2 and ZeRO-3, fp32 and bf16, full fine-tuning and (fp32 weights)
LoRA on attention and the experts.

- With R3 the ratio is exactly 1, the KL exactly 0, nothing clipped, and no token uses other experts than
  the sampler chose (``routing/sampler_mismatch`` and ``routing/update_mismatch`` 0);
- a tiny Mixtral, in the mismatched cells of one process, FSDP2 and ZeRO-3, the same;
- where the sampler computes in another precision (a bf16 copy feeding an fp32 trainer; FSDP's bf16
  gathered weights), the same step without replay routes tokens differently from the sampler
  (``routing/sampler_mismatch`` > 0), R3 overrode those tokens, and the sampler-vs-trainer log-prob gap with
  R3 is no larger than without (logged where the sampler is not pi_old: the bf16 copy; FSDP cannot make
  one, its bf16 sampler reads the trainer's own gathered weights).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.test_multiprocess import run_two_processes

from ._moe_worker import MIXTRAL_CELLS, MODES_OF, PLACEMENTS, PRECISIONS, cell_name, mismatched

WORKER = Path(__file__).with_name("_moe_worker.py")
CELLS = [
    (placement, precision, mode)
    for placement in PLACEMENTS[1] + PLACEMENTS[2]
    for precision in PRECISIONS
    for mode in MODES_OF[precision]
]


@pytest.fixture(scope="module")
def moe_matrix(close_moe_dirs, tmp_path_factory) -> tuple[Path, str | None]:
    out = tmp_path_factory.mktemp("moe-matrix")
    policies = [str(close_moe_dirs["qwen3_moe"]), str(close_moe_dirs["mixtral"])]
    try:
        single = subprocess.run([sys.executable, str(WORKER), *policies, str(out), "1"],
                                capture_output=True, text=True, timeout=900)  # fmt: skip
        assert single.returncode == 0, single.stderr[-4000:]
        run_two_processes(WORKER, *policies, str(out), "2", timeout=1200)
    except (AssertionError, subprocess.TimeoutExpired) as failure:
        return out, f"{type(failure).__name__}: {failure}"
    return out, None


def test_every_moe_cell_ran(moe_matrix):
    assert moe_matrix[1] is None, moe_matrix[1]


def records(out: Path, cell: tuple, replay: str, arch: str = "") -> list[dict]:
    ranks = 1 if cell[0] == "single" else 2
    folder = out / ((f"{arch}-" if arch else "") + cell_name(*cell))  # arch "": the Qwen3-MoE cells
    return [json.loads((folder / f"{replay}-rank{k}.json").read_text()) for k in range(ranks)]


@pytest.fixture
def matrix(moe_matrix) -> Path:
    if moe_matrix[1] is not None:
        pytest.skip("the MoE matrix launches failed: see test_every_moe_cell_ran")
    return moe_matrix[0]


@pytest.mark.parametrize("cell", CELLS, ids=[cell_name(*c) for c in CELLS])
def test_r3_at_learning_rate_zero_keeps_ratio_one_kl_zero_and_the_samplers_experts(matrix, cell):
    for metrics in records(matrix, cell, "R3"):
        assert metrics["ratio_mean"] == 1.0, metrics
        assert metrics["kl"] == 0.0, metrics
        assert metrics["clip_ratio/region_mean"] == 0.0, metrics
        assert metrics["routing/sampler_mismatch"] == 0.0
        assert metrics["routing/update_mismatch"] == 0.0
        if mismatched(cell[0], cell[1]):
            assert metrics["routing/sampler_overridden"] > 0.05  # R3 imposed the sampler's other experts


MISMATCHED = [("", c) for c in CELLS if c[2] == "full" and mismatched(c[0], c[1])]
MISMATCHED += [("mixtral", (*c, "full")) for cells in MIXTRAL_CELLS.values() for c in cells]
IDS = [f"{arch or 'qwen3_moe'}-{cell_name(*cell)}" for arch, cell in MISMATCHED]


@pytest.mark.parametrize(("arch", "cell"), MISMATCHED, ids=IDS)
def test_without_replay_the_trainer_routes_otherwise_and_r3_narrows_the_logprob_gap(matrix, arch, cell):
    for off, r3 in zip(records(matrix, cell, "off", arch), records(matrix, cell, "R3", arch)):
        assert off["routing/sampler_mismatch"] > 0.05, off
        gap = "sampling/sampling_logp_difference/mean"  # logged where the sampler is not pi_old (a bf16 copy)
        assert (gap in off) == (gap in r3) == (cell[1] == "fp32")
        if gap in off:
            assert r3[gap] <= off[gap], (r3[gap], off[gap])
        assert r3["ratio_mean"] == 1.0 and r3["kl"] == 0.0  # lr 0
        assert r3["routing/sampler_mismatch"] == 0.0 and r3["routing/sampler_overridden"] > 0.05
