"""Run by tests/moe/test_moe_placements.py: a tiny Qwen3-MoE policy whose router logits are close (bf16
rounding flips experts) in every placement x precision x (full fine-tuning, LoRA on attention and experts),
one ``GRPOTrainer`` step at learning rate 0 (mu 2, beta 0.04) with the real fast sampler, routing_replay R3;
and in the cells whose sampler computes in another precision than the trainer, the same step without replay.
A tiny Mixtral runs the mismatched cells of one process, FSDP2 and ZeRO-3 (``MIXTRAL_CELLS``).

The sampler: a bfloat16 copy of the policy (``generation_dtype``) where the trainer is fp32; under FSDP with
bf16 the sampler reads the bf16 gathered weights. Writes ``<out>/<cell>/<run>-rank<k>.json`` with the step's
metrics.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate.state import AcceleratorState

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.parallel.distributed import end_processes

PLACEMENTS = {1: ["single"], 2: ["ddp", "fsdp", "zero2", "zero3"]}
PRECISIONS = ["fp32", "bf16"]
MODES = ["full", "lora"]
MODES_OF = {"fp32": MODES, "bf16": ["full"]}
"""LoRA (on attention and the experts) with fp32 weights; LoRA under bf16 autocast is the dense matrix's."""
ROWS = [{"prompt": f"{a}+{b}+{a}{b}=", "solution": str(a + b)} for a in range(4) for b in range(4)]


def reward(completions, solution, **kwargs):
    return [(1.0 if s in c else 0.0) + 0.1 * len(c) for c, s in zip(completions, solution)]


def cell_name(placement: str, precision: str, mode: str) -> str:
    return f"{placement}-{precision}-{mode}"


def bf16_sampler_copy(placement: str, precision: str) -> bool:
    """Whether the cell samples from a bfloat16 copy of an fp32 trainer's weights (FSDP: made before the
    weights are sharded, refreshed from the gathered ones)."""
    return precision == "fp32"


def mismatched(placement: str, precision: str) -> bool:
    """Whether the sampler computes in another precision than the trainer's passes (a bf16 copy of fp32
    weights), or, under FSDP with bf16, with the gathered bf16 weights and another kernel."""
    return bf16_sampler_copy(placement, precision) or (placement == "fsdp" and precision == "bf16")


def config(out: Path, placement: str, precision: str, replay: str) -> GRPOConfig:
    processes = 1 if placement == "single" else 2
    return GRPOConfig(
        output_dir=str(out),
        max_steps=1,
        num_generations=4,
        per_device_train_batch_size=8 // processes,
        gradient_accumulation_steps=2,
        max_completion_length=6,
        num_iterations=2,
        beta=0.04,
        learning_rate=0.0,
        fsdp="full_shard" if placement == "fsdp" else "",
        deepspeed=placement if placement.startswith("zero") else None,
        bf16=precision == "bf16",
        generation_dtype="bfloat16" if bf16_sampler_copy(placement, precision) else "auto",
        generation_backend="fast",
        routing_replay=replay,
        reuse_sampler_logprobs=False,  # pi_old from the old-policy pass (the sampler's agree to ~1e-7 only)
        save_steps=0,
        logging_steps=1,
        shuffle_dataset=False,
        disable_tqdm=True,
        report_to=[],
        seed=0,
    )


def lora_config() -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], task_type="CAUSAL_LM",
    )  # fmt: skip


def run(policy_dir: str, out: Path, placement: str, precision: str, mode: str, replay: str) -> None:
    AcceleratorState._reset_state(reset_partial_state=False)  # each cell its own precision
    args = config(out / f"{replay}-run", placement, precision, replay)
    peft = lora_config() if mode == "lora" else None
    trainer = GRPOTrainer(policy_dir, [reward], args, train_dataset=ROWS, peft_config=peft)
    (metrics,) = trainer.train()
    rank = trainer.accelerator.process_index
    record = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    (out / f"{replay}-rank{rank}.json").write_text(json.dumps(record))
    trainer.accelerator.wait_for_everyone()


MIXTRAL_CELLS = {1: [("single", "fp32")], 2: [("fsdp", "fp32"), ("zero3", "fp32")]}
"""Where the Mixtral policy runs too (full fine-tuning, R3 and without replay): the mismatched cells."""


def main(policy_dir: str, mixtral_dir: str, out: str, processes: str, placements: str = "all") -> None:
    torch.set_num_threads(1)
    chosen = PLACEMENTS[int(processes)] if placements == "all" else placements.split(",")
    for placement in chosen:
        for precision in PRECISIONS:
            for mode in MODES_OF[precision]:
                cell = Path(out) / cell_name(placement, precision, mode)
                run(policy_dir, cell, placement, precision, mode, "R3")
                if mode == "full" and mismatched(placement, precision):
                    run(policy_dir, cell, placement, precision, mode, "off")
    for placement, precision in MIXTRAL_CELLS[int(processes)]:
        if placement in chosen:
            cell = Path(out) / f"mixtral-{cell_name(placement, precision, 'full')}"
            for replay in ("R3", "off"):
                run(mixtral_dir, cell, placement, precision, "full", replay)


if __name__ == "__main__":
    main(*sys.argv[1:])
    end_processes()
