"""Run by tests/train/test_multiprocess.py under ``torchrun --nproc_per_node 2``: 3 GRPO steps straight, and
2 steps + checkpoint + a resumed third step, on CPU processes (gloo). Each process writes its parameters'
checksums after both runs to ``<out>/resume-rank<k>.json``."""

from __future__ import annotations

import json
import sys

import torch

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.parallel.distributed import end_processes


def reward(prompts, completions, completion_ids, solution, **kwargs):
    return [
        (1.0 if s in c else 0.0) + 0.1 * (sum(i) % 5)
        for c, s, i in zip(completions, solution, completion_ids)
    ]


def config(out: str, **overrides) -> GRPOConfig:
    values = dict(
        output_dir=out,
        max_steps=3,
        num_generations=4,
        per_device_train_batch_size=8,  # 2 prompts x G=4 on each of the 2 processes
        max_completion_length=6,
        num_iterations=2,
    )
    values.update(overrides)
    return GRPOConfig(
        **values, beta=0.04, learning_rate=1e-2, disable_tqdm=True, log_completions=True, seed=0
    )


def checksum(trainer: GRPOTrainer) -> list[float]:
    params = torch.cat([p.detach().flatten() for p in trainer.unwrapped_model.parameters()])
    return [float(params.sum()), float(params.abs().sum()), float((params * params).sum())]


def main(policy_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    rows = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(4) for b in range(4)]
    straight = GRPOTrainer(policy_dir, [reward], config(f"{out}/straight"), train_dataset=rows)
    straight.train()
    first = GRPOTrainer(policy_dir, [reward], config(f"{out}/split", save_steps=2), train_dataset=rows)
    first.max_steps = 2  # interrupted after the checkpoint at step 2
    first.train()
    resumed = GRPOTrainer(policy_dir, [reward], config(f"{out}/split", save_steps=2), train_dataset=rows)
    resumed.train(resume_from_checkpoint=True)
    rank = resumed.accelerator.process_index
    record = {"straight": checksum(straight), "resumed": checksum(resumed), "step": resumed.step}
    with open(f"{out}/resume-rank{rank}.json", "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    end_processes()
