"""Run by tests/train/test_dynamic_sampling_processes.py under ``torchrun --nproc_per_node 2``: one GRPO step
with dynamic sampling whose informative groups fall unevenly on the two processes; each process writes the
prompts it trained on to ``<out>/rank<k>.json``."""

from __future__ import annotations

import json
import sys

import torch

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.parallel.distributed import end_processes
from grpokit.rollout import ScriptedBackend

ROWS = [{"prompt": f"{k}+0=", "solution": str(k)} for k in range(8)]
FLAT = {"2+0=", "3+0=", "5+0="}  # process 0 samples rows 0, 1 then 4, 5; process 1 rows 2, 3 then 6, 7


def respond(prompt: str, index: int) -> str:
    if prompt in FLAT:
        return "7"
    return prompt[0] if index % 2 == 0 else "9"


def exact(prompts, completions, completion_ids, solution, **kwargs):
    return [1.0 if c.strip() == s else 0.0 for c, s in zip(completions, solution)]


def main(policy_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    config = GRPOConfig(
        output_dir=f"{out}/run", max_steps=1, num_generations=4, per_device_train_batch_size=8,
        max_completion_length=4, beta=0.0, learning_rate=1e-2, disable_tqdm=True, seed=0,
        shuffle_dataset=False, dynamic_sampling=True, max_sampling_rounds=4,
    )  # fmt: skip
    trainer = GRPOTrainer(model=policy_dir, reward_funcs=[exact], args=config, train_dataset=ROWS)
    trainer.backend = ScriptedBackend(trainer.tokenizer, respond)
    trained: list[list[str]] = []
    rollout_batch = trainer.rollout_batch  # step 4: the groups this process trains on, batched

    def recording(samples, advantages):
        trained.append([row["prompt"] for row in samples.rows])
        return rollout_batch(samples, advantages)

    trainer.rollout_batch = recording
    (metrics,) = trainer.train()
    params = torch.cat([p.detach().flatten() for p in trainer.unwrapped_model.parameters()])
    rank = trainer.accelerator.process_index
    record = {
        "trained": trained,
        "metrics": metrics,
        "checksum": [float(params.sum()), float(params.abs().sum())],
    }
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    end_processes()
