"""Run by tests/train/test_multiprocess.py under ``torchrun --nproc_per_node 2``: two self-play GRPO steps
(the ``Dialogue`` game of ``tests/envs/test_selfplay.py``, SPIRAL's role baselines) on CPU processes, each
writing what it saw to ``<out>/selfplay-rank<k>.json``; ``resume``: against a pool of snapshots, 3 steps
straight and 2 steps + checkpoint + a resumed third, each process writing both ends to
``<out>/selfplay-resume-rank<k>.json``."""

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


def resume(policy_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    rows = [{"prompt": f"Talk {k}.\n", "game_seed": k} for k in range(8)]

    def trainer(folder: str, **extra) -> GRPOTrainer:
        config = GRPOConfig(
            output_dir=f"{out}/{folder}", max_steps=3, num_generations=4, per_device_train_batch_size=8,
            max_completion_length=64, max_turn_tokens=4, learning_rate=1e-2, role_advantage="rae",
            game_opponent="pool", snapshot_every=1, snapshot_pool_size=2, disable_tqdm=True, seed=0, **extra,
        )  # fmt: skip
        return GRPOTrainer(policy_dir, environment_reward, config, train_dataset=rows, environment=Dialogue)

    def ends(run: GRPOTrainer) -> dict:
        params = torch.cat([p.detach().flatten() for p in run.unwrapped_model.parameters()])
        pool = run.selfplay.pool.snapshots
        return {"checksum": [float(params.sum()), float(params.abs().sum())], "pool": [s for s, _ in pool],
                "pool_checksum": [float(sum(v.double().sum() for v in w.values())) for _, w in pool],
                "baselines": run.selfplay.baselines.state_dict(), "step": run.step}  # fmt: skip

    straight = trainer("straight")
    straight.train()
    first = trainer("split", save_steps=2)
    first.max_steps = 2  # interrupted after the checkpoint at step 2
    first.train()
    resumed = trainer("split", save_steps=2)
    resumed.train(resume_from_checkpoint=True)
    record = {"straight": ends(straight), "resumed": ends(resumed)}
    Path(out, f"selfplay-resume-rank{resumed.accelerator.process_index}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    if sys.argv[3:] == ["resume"]:
        resume(*sys.argv[1:3])
    else:
        main(*sys.argv[1:3])
    end_processes()
