"""Run by tests/train/test_crash_safety.py in a subprocess: a GRPO run of ``max_steps`` steps with a
checkpoint every step, slowed by its reward (0.3 s per step) so that a test can signal or kill it midway.
``resume``: continue from the latest checkpoint; ``selfplay``: a two-player game (the ``Dialogue`` of
``tests/envs/test_selfplay.py``) played against itself with SPIRAL's role baselines, whose
state goes through the checkpoint. Writes the final weights to ``<out>/weights.pt`` (self-playing, also the
role baselines to ``<out>/baselines.json``); ``pool``: the same against a pool of the policy's snapshots
(``<out>/pool.pt``)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from grpokit import GRPOConfig, GRPOTrainer

ROWS = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(4) for b in range(4)]


def slow_reward(prompts, completions, completion_ids, solution, **kwargs):
    time.sleep(0.3)
    return [(1.0 if s in c else 0.0) + 0.1 * len(c) for c, s in zip(completions, solution)]


def slow_game_reward(prompts, completions, completion_ids, env_reward, **kwargs):
    time.sleep(0.3)
    return env_reward


def run(
    policy_dir: str, out: str, max_steps: int, resume: bool, selfplay: bool = False, pool: bool = False
) -> GRPOTrainer:
    torch.set_num_threads(1)
    game = dict(role_advantage="rae", rae_decay=0.5, max_completion_length=64, max_turn_tokens=4)
    if pool:
        game.update(game_opponent="pool", snapshot_every=2, snapshot_pool_size=2)
    environment = None
    if selfplay:
        sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository: its tests package
        from tests.envs.test_selfplay import Dialogue

        environment = Dialogue
    values = dict(
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
    config = GRPOConfig(**{**values, **(game if selfplay else {})})
    rows = [{"prompt": "Talk.\n", "game_seed": deal} for deal in range(6)] if selfplay else ROWS
    reward = slow_game_reward if selfplay else slow_reward
    trainer = GRPOTrainer(policy_dir, [reward], config, train_dataset=rows, environment=environment)
    trainer.train(resume_from_checkpoint="latest" if resume else None)
    if trainer.stopped_by is None:
        torch.save({k: v.clone() for k, v in trainer.model.state_dict().items()}, f"{out}/weights.pt")
        if selfplay:
            Path(out, "baselines.json").write_text(json.dumps(trainer.selfplay.baselines.state_dict()))
        if pool:
            torch.save(trainer.selfplay.pool.state_dict(), f"{out}/pool.pt")
    return trainer


if __name__ == "__main__":
    extra = sys.argv[4:]
    pool = "pool" in extra
    run(sys.argv[1], sys.argv[2], int(sys.argv[3]), "resume" in extra, "selfplay" in extra or pool, pool)
