"""Run by tests/vision/test_vision_processes.py under ``torchrun --nproc_per_node 2``: a tiny vision-language
policy at learning rate 0 (mu 2, beta 0.04) in each cell of ``CELLS`` (every placement, bf16, LoRA), each
process writing its metrics to ``<out>/<cell>-rank<k>.json``."""

from __future__ import annotations

import json
import sys

import torch
from PIL import Image

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.parallel.distributed import end_processes

PLACEMENTS = ("ddp", "fsdp", "zero2", "zero3")
LAUNCHES = ([*PLACEMENTS, "ddp-lora", "zero3-lora"], ["ddp-bf16"])
"""The cells of each launch (a process's precision is fixed once its accelerator exists): every placement in
fp32 with all weights trained, LoRA adapters under DDP and ZeRO-3; DDP in bf16."""
CELLS = [cell for cells in LAUNCHES for cell in cells]
COLOURS = [(220, 30, 30), (30, 30, 220), (30, 200, 30), (200, 200, 30)]


def varied(completions, **_):
    """Rewards that differ within a group, so the update has a gradient to follow."""
    return [float(sum(map(ord, c[0]["content"])) % 5) for c in completions]


def main(policy_dir: str, out: str, launch: int) -> None:
    torch.set_num_threads(1)
    rows = [{"prompt": [{"role": "user", "content": f"colour {i}?"}],
             "image": Image.new("RGB", (32, 32), COLOURS[i % 4])} for i in range(8)]  # fmt: skip
    for cell in LAUNCHES[launch]:
        placement, _, variant = cell.partition("-")
        peft_config = None
        if variant == "lora":
            from peft import LoraConfig

            peft_config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
        config = GRPOConfig(
            output_dir=f"{out}/{cell}", bf16=variant == "bf16", max_steps=2, num_generations=4,
            per_device_train_batch_size=4,
            max_completion_length=5, learning_rate=0.0, beta=0.04, num_iterations=2, logging_steps=1,
            report_to=[], disable_tqdm=True, seed=0, save_steps=0,
            fsdp="full_shard" if placement == "fsdp" else "",
            deepspeed=placement if placement.startswith("zero") else None,
        )  # fmt: skip
        trainer = GRPOTrainer(
            model=policy_dir, reward_funcs=varied, args=config, train_dataset=rows, peft_config=peft_config
        )
        history = trainer.train()
        rank = trainer.accelerator.process_index
        record = {"history": list(history), "num_processes": trainer.accelerator.num_processes}
        with open(f"{out}/{cell}-rank{rank}.json", "w") as f:
            json.dump(record, f)
        trainer.accelerator.wait_for_everyone()
    end_processes()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
