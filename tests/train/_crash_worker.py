"""Run by tests/train/test_crash_safety.py in a subprocess: a GRPO run of ``max_steps`` steps with a
checkpoint every step, slowed by its reward (0.3 s per step) so that a test can signal or kill it midway.
``resume``: continue from the latest checkpoint. Writes the final weights to ``<out>/weights.pt``."""

from __future__ import annotations

import sys
import time

import torch

from grpokit import GRPOConfig, GRPOTrainer

ROWS = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(4) for b in range(4)]


def slow_reward(prompts, completions, completion_ids, solution, **kwargs):
    time.sleep(0.3)
    return [(1.0 if s in c else 0.0) + 0.1 * len(c) for c, s in zip(completions, solution)]


def run(policy_dir: str, out: str, max_steps: int, resume: bool) -> GRPOTrainer:
    torch.set_num_threads(1)
    config = GRPOConfig(
        output_dir=out,
        max_steps=max_steps,
        save_steps=1,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=6,
        learning_rate=1e-2,
        log_completions=True,
        disable_tqdm=True,
        generation_backend="fast",
        seed=0,
    )
    trainer = GRPOTrainer(policy_dir, [slow_reward], config, train_dataset=ROWS)
    trainer.train(resume_from_checkpoint="latest" if resume else None)
    if trainer.stopped_by is None:
        torch.save({k: v.clone() for k, v in trainer.model.state_dict().items()}, f"{out}/weights.pt")
    return trainer


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:] == ["resume"])
