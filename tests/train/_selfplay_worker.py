"""Run by tests/train/test_multiprocess.py under ``torchrun --nproc_per_node 2``: two self-play GRPO steps
(the ``Dialogue`` game of ``tests/envs/test_selfplay.py``, SPIRAL's role baselines) on CPU processes, each
writing what it saw to ``<out>/selfplay-rank<k>.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository: its tests package

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.envs import environment_reward
from grpokit.parallel.distributed import end_processes
from tests.envs.test_selfplay import Dialogue


def main(policy_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    rows = [{"prompt": f"Talk {k}.\n", "game_seed": k} for k in range(8)]
    config = GRPOConfig(
        output_dir=f"{out}/run", max_steps=2, num_generations=4, per_device_train_batch_size=8,
        max_completion_length=64, max_turn_tokens=4, learning_rate=1e-2, role_advantage="rae",
        rae_decay=0.5, log_completions=True, disable_tqdm=True, seed=0,
    )  # fmt: skip
    trainer = GRPOTrainer(policy_dir, environment_reward, config, train_dataset=rows, environment=Dialogue)
    history = trainer.train()
    params = torch.cat([p.detach().flatten() for p in trainer.unwrapped_model.parameters()])
    rank = trainer.accelerator.process_index
    record = {
        "param_checksum": [float(params.sum()), float(params.abs().sum())],
        "history": history,
        "baselines": trainer.selfplay.baselines.state_dict(),
    }
    Path(out, f"selfplay-rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(*sys.argv[1:3])
    end_processes()
