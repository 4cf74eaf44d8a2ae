"""The scale path held to invariants: every placement (one process, DDP, FSDP2, DeepSpeed ZeRO-2 and ZeRO-3
on two CPU processes over gloo) x precision (fp32; ``bf16=true`` as a user sets it) x full fine-tuning /
LoRA x gradient checkpointing off / on, each cell a real ``GRPOTrainer`` on the same scripted batch
(``_matrix_worker.py``; one launch for the two-process cells, one for the single-process ones):

- at learning rate 0 (mu 2, beta 0.04): the ratio is exactly 1, the KL exactly 0, no token clipped, and the
  loss equals the single-process fp32 run's within the precision's tolerance; the completions' lengths
  differ, so every pass runs padding-free (``grpokit.models.packing``, chosen automatically);
- one real step: the weights equal the single-process run's of the same precision on the same global
  batch, within the tolerance float sums allow (``assert_same_weights``);
- save, drop the trainer, resume from the checkpoint: the next step equals the uninterrupted run's, and
  every file the resume reads is mapped to the reading process's own device (or the CPU); under FSDP and
  ZeRO-3 only the main process reads the full weights, optimizer state and reference;
- DDP all-reduces once per optimizer step, not once per micro-batch (``no_sync``);
- DeepSpeed steps at grpokit's optimizer-step boundary, also for a partial chunk of micro-batches;
- micro-batches filled by a token budget (``micro_batch_tokens``): as many on every process under FSDP2 and
  ZeRO-3, and the step equals one micro-batch of every row.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ._matrix_worker import CHECKPOINTING, MODES, PLACEMENTS, PRECISIONS, cell_name
from .test_multiprocess import run_two_processes

WORKER = Path(__file__).with_name("_matrix_worker.py")
CELLS = [
    (placement, precision, mode, gc)
    for placement in PLACEMENTS[1] + PLACEMENTS[2]
    for precision in PRECISIONS
    for mode in MODES
    for gc in CHECKPOINTING
]


@pytest.fixture(scope="module")
def matrix_run(tiny_model_dir, tmp_path_factory) -> tuple[Path, str | None]:
    """Every cell run: the single-process column in one process, the rest in one two-process launch; the
    folder and, if a launch failed or ran out of time, why (reported once, by ``test_every_cell_ran``)."""
    out = tmp_path_factory.mktemp("matrix")
    try:
        single = subprocess.run(
            [sys.executable, str(WORKER), str(tiny_model_dir), str(out), "1"],
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        assert single.returncode == 0, single.stderr[-4000:]
        run_two_processes(WORKER, str(tiny_model_dir), str(out), "2", timeout=1800)
    except (AssertionError, subprocess.TimeoutExpired) as failure:
        return out, f"{type(failure).__name__}: {failure}"
    return out, None


@pytest.fixture
def matrix(matrix_run) -> Path:
    """The cells' folder; skipped when the launches failed (that failure is one test's, not every cell's)."""
    out, failure = matrix_run
    if failure is not None:
        pytest.skip("the matrix launches failed: see test_every_cell_ran")
    return out


def test_every_cell_ran(matrix_run):
    assert matrix_run[1] is None, matrix_run[1]


def records(out: Path, cell: tuple) -> list[dict]:
    directory = out / cell_name(*cell)
    ranks = 1 if cell[0] == "single" else 2
    return [json.loads((directory / f"rank{k}.json").read_text()) for k in range(ranks)]


def weights(out: Path, cell: tuple, run: str) -> dict[str, torch.Tensor]:
    return load_file(str(out / cell_name(*cell) / f"{run}.safetensors"))


def assert_close_weights(a: dict, b: dict, atol: float, mean_atol: float) -> None:
    """No element differs by more than ``atol``, and the mean difference is below ``mean_atol``."""
    assert set(a) == set(b)
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=atol, rtol=0, msg=name)
    difference = torch.cat([(a[k] - b[k]).flatten() for k in a]).abs()
    assert float(difference.mean()) < mean_atol


# One step (mu 2: two AdamW steps) against the single-process run. fp32: the same sums in another order
# (gradients all-reduced, accumulated over micro-batches); AdamW's normalised step g / sqrt(v) turns a
# rounding difference in a near-zero gradient into a visible one: at most 5.3e-6 measured, in a handful of
# elements, against moves of ~2e-2; a placement that lost or double-counted gradients would differ by the
# whole move. bf16: the cells round differently (FSDP computes in bf16 throughout, autocast keeps norms and
# softmax in float32), and each AdamW step turns a flipped sign of a near-zero gradient into a step of the
# learning rate the other way: there the update's direction is compared (cosine measured >= 0.99), and no
# element may differ by more than two steps each way.
LR0_LOSS_TOLERANCE = {"fp32": 1e-6, "bf16": 1e-6}  # the loss at lr 0 is the advantages' mean: ~0
LR0_GRAD_NORM_TOLERANCE = {"fp32": 1e-6, "bf16": 5e-3}  # relative to one fp32 process (bf16: 8-bit mantissa)
PLAIN_CELLS = [c for c in CELLS if not c[3]]


def learning_rate(cell: tuple) -> float:
    return 5e-2 if cell[2] == "lora" else 1e-2


@pytest.mark.parametrize("cell", CELLS, ids=[cell_name(*c) for c in CELLS])
def test_learning_rate_zero_leaves_ratio_one_and_kl_zero(matrix, cell):
    reference = records(matrix, ("single", "fp32", cell[2], False))[0]["lr0"]
    for record in records(matrix, cell):
        metrics = record["lr0"]
        assert record["attention"] == "grpokit_packed_sdpa"  # the passes ran padding-free (models.packing)
        assert metrics["ratio_mean"] == 1.0, metrics
        assert metrics["kl"] == 0.0, metrics
        assert metrics["clip_ratio/region_mean"] == 0.0, metrics
        assert metrics["loss"] == pytest.approx(reference["loss"], abs=LR0_LOSS_TOLERANCE[cell[1]])
        tolerance = LR0_GRAD_NORM_TOLERANCE[cell[1]]
        assert metrics["grad_norm"] == pytest.approx(reference["grad_norm"], rel=tolerance)


def start_weights(model_dir: Path, cell: tuple, lora_like: dict) -> dict[str, torch.Tensor]:
    """The weights before any step: the model's, or LoRA adapters with B = 0 (A is drawn by peft)."""
    if cell[2] == "lora":
        return {k: torch.zeros_like(v) if "lora_B" in k else v for k, v in lora_like.items()}
    return load_file(str(next(Path(model_dir).glob("*.safetensors"))))


@pytest.mark.parametrize("cell", CELLS, ids=[cell_name(*c) for c in CELLS])
def test_one_step_equals_the_single_process_run(matrix, cell, tiny_model_dir):
    single = weights(matrix, ("single", *cell[1:]), "step1")
    placed = weights(matrix, cell, "step1")
    start = start_weights(tiny_model_dir, cell, single)
    moved = [k for k in placed if cell[2] == "full" or "lora_B" in k]  # (LoRA's A gets a gradient too)
    single_move = torch.cat([(single[k] - start[k]).flatten() for k in moved])
    placed_move = torch.cat([(placed[k] - start[k]).flatten() for k in moved])
    assert float(placed_move.abs().mean()) > 0.3 * learning_rate(cell)  # a real step of about lr per weight
    if cell[1] == "fp32":
        assert_close_weights(single, placed, 5e-5, 1e-7)
        return
    cosine = torch.nn.functional.cosine_similarity(single_move, placed_move, dim=0)
    assert float(cosine) > 0.99, float(cosine)
    assert_close_weights(single, placed, 4 * learning_rate(cell) + 1e-6, 1e-3)


@pytest.mark.parametrize("cell", PLAIN_CELLS, ids=[cell_name(*c) for c in PLAIN_CELLS])
def test_resume_continues_exactly_and_reads_onto_its_own_device(matrix, cell):
    assert_close_weights(weights(matrix, cell, "step2"), weights(matrix, cell, "resumed"), 1e-6, 1e-8)
    for rank, record in enumerate(records(matrix, cell)):
        own = {record["device"], "cpu", "function -> cpu"}  # DeepSpeed's files: onto the CPU, then moved
        assert record["resume_reads"], "the resume read no file"
        for file, mapped in record["resume_reads"]:
            assert mapped in own, f"rank {rank} read {file} onto {mapped}"
        full_states = {"model.safetensors", "optimizer.pt", "adapter_model.safetensors"}
        if rank > 0 and cell[0] in ("fsdp", "zero3"):  # the main process reads and sends the full states
            assert not full_states & {file for file, _ in record["resume_reads"]}, record["resume_reads"]


@pytest.mark.parametrize("cell", CELLS, ids=[cell_name(*c) for c in CELLS])
def test_generation_reads_the_trained_weights_and_zero3_keeps_no_copy(matrix, cell):
    """Greedy completions from the weights generation reads (FSDP gathered, ZeRO-3 a copy filled for the
    call) equal the single-process model's (fp32: the weights agree to 5e-6); under FSDP with bf16 the
    sampler reads bf16 gathered weights; ZeRO-3's generation copy holds nothing between generations."""
    single = records(matrix, ("single", *cell[1:]))[0]
    for record in records(matrix, cell):
        if cell[1] == "fp32":
            assert record["greedy"] == single["greedy"]
        bf16_gather = cell[0] == "fsdp" and cell[1] == "bf16"
        assert record["generation_dtype"] == ("torch.bfloat16" if bf16_gather else "torch.float32")
        assert (record["generation_copy_elements"] == 0) == (cell[0] == "zero3")


@pytest.mark.parametrize("cell", [c for c in CELLS if c[0] == "ddp"], ids=lambda c: cell_name(*c))
def test_ddp_all_reduces_once_per_optimizer_step(matrix, cell):
    for record in records(matrix, cell):
        assert record["allreduce_rounds"] == record["optimizer_steps"]  # not once per micro-batch (2x)


@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_deepspeed_steps_at_the_boundary_of_a_partial_chunk(matrix, stage):
    """Three micro-batches with gradient_accumulation_steps 2: two optimizer steps (DeepSpeed's own counter
    would take one, and carry the third micro-batch's gradients into the next step)."""
    ddp = load_file(str(matrix / "ragged-ddp.safetensors"))
    zero = load_file(str(matrix / f"ragged-{stage}.safetensors"))
    assert_close_weights(ddp, zero, 5e-5, 1e-7)


@pytest.mark.parametrize("placement", ["fsdp", "zero3"])
def test_token_budget_micro_batches_equal_one_micro_batch_on_sharded_weights(matrix, placement):
    """micro_batch_tokens: the processes need different numbers of micro-batches (long completions on one,
    short on the other) and run as many as the one that needs most; the step's weights equal those of one
    micro-batch holding every row of each process."""
    counts = [json.loads((matrix / f"token-budget-{placement}-rank{r}.json").read_text()) for r in (0, 1)]
    assert counts[0]["needed"] > counts[1]["needed"] >= 1
    assert counts[0]["run"] == counts[1]["run"] == counts[0]["needed"]
    budget = load_file(str(matrix / f"token-budget-{placement}-budget.safetensors"))
    whole = load_file(str(matrix / f"token-budget-{placement}-whole.safetensors"))
    assert_close_weights(whole, budget, 5e-5, 1e-7)


@pytest.mark.parametrize("cell", [c for c in CELLS if c[3]], ids=lambda c: cell_name(*c))
def test_gradient_checkpointing_changes_nothing(matrix, cell):
    plain = weights(matrix, (*cell[:3], False), "step1")
    assert_close_weights(plain, weights(matrix, cell, "step1"), 1e-6, 1e-8)
