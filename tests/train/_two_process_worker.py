"""Run by tests/train/test_multiprocess.py under ``torchrun --nproc_per_node 2``: two GRPO steps on CPU
processes (gloo), each writing what it saw to ``<out>/rank<k>.json``."""

from __future__ import annotations

import json
import sys

import torch

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.parallel.distributed import end_processes


def reward(prompts, completions, completion_ids, solution, **kwargs):
    """Solution present (1.0) plus a token-id term, so groups of a random policy differ."""
    return [
        (1.0 if s in c else 0.0) + 0.1 * (sum(i) % 5)
        for c, s, i in zip(completions, solution, completion_ids)
    ]


def main(policy_dir: str, out: str, decode: str = "compact") -> None:
    """``decode``: "compact" (the fast sampler's default: finished rows leave the decode batch) or "whole"
    (every row decoded to the end)."""
    torch.set_num_threads(1)
    rows = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(4) for b in range(4)]
    config = GRPOConfig(
        output_dir=f"{out}/run",
        max_steps=2,
        num_generations=4,
        per_device_train_batch_size=8,  # 2 prompts x G=4 on each of the 2 processes
        max_completion_length=6,
        beta=0.04,
        learning_rate=1e-2,
        disable_tqdm=True,
        log_completions=True,
        eval_strategy="steps",
        eval_steps=1,
        seed=0,
    )
    eval_rows = [{"prompt": f"{a}+{a}=", "solution": str(2 * a)} for a in range(5)]  # 3 + 2 rows per process
    trainer = GRPOTrainer(
        model=policy_dir, reward_funcs=[reward], args=config, train_dataset=rows, eval_dataset=eval_rows
    )
    trainer.backend.compact = decode == "compact"
    decoded: list[dict[str, int]] = []
    generate = trainer.backend.generate

    def counting(*args, **kwargs):
        out = generate(*args, **kwargs)
        decoded.append(dict(trainer.backend.last_stats))
        return out

    trainer.backend.generate = counting
    seen: list[list[str]] = []
    next_local_indices = trainer.prompts.next_local_indices

    def recording(accelerator, count=None):
        local = next_local_indices(accelerator, count)
        seen.append([rows[i]["prompt"] for i in local])
        return local

    trainer.prompts.next_local_indices = recording
    history = trainer.train()
    params = torch.cat([p.detach().flatten() for p in trainer.unwrapped_model.parameters()])
    rank = trainer.accelerator.process_index
    record = {
        "rank": rank,
        "num_processes": trainer.accelerator.num_processes,
        "prompts": seen,
        "param_checksum": [float(params.sum()), float(params.abs().sum())],
        "history": history,
        "decoded": decoded,
    }
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
    end_processes()
