"""A run that plays a game (``grpokit.envs.selfplay``): role-wise advantages, ``selfplay/*`` metrics, and the
exact yardstick where the game has one.

- **Advantages.** A prompt's episodes are its roles' seats, role-major, so ``role_advantage="group"`` is the
  usual group advantage over each prompt's group split by role (``core.role_group_sizes``). ``"rae"``
  replaces it by SPIRAL's role-conditioned baselines (``core.RoleBaselines``), read and updated over every
  process's episodes in the same order, so every process holds the same baselines; they are checkpointed.
  ``"prompt"`` (an ablation) is plain GRPO's group: every seat of a prompt against one baseline.
- **The snapshot pool** (``game_opponent="pool"``): the policy's weights at step 0 and after every
  ``snapshot_every``-th update, the newest ``snapshot_pool_size`` kept in CPU memory; each step's games
  are played against one snapshot drawn uniformly (torch's random state, which a resume restores), loaded
  into a copy of the policy. The pool is checkpointed. ``selfplay/pool_size`` and
  ``selfplay/opponent_step`` (the drawn snapshot's step) are logged.
- **Metrics.** ``selfplay/*`` of the step's episodes (``envs.selfplay.game_metrics``) and, for Kuhn poker,
  ``selfplay/exploitability``: the exact exploitability of the policy's strategy read from its
  log-probabilities after the step's update (``eval.games``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from grpokit.core import RoleBaselines, combine_rewards, multi_reward_advantages, role_group_sizes
from grpokit.data.integrity import InputError
from grpokit.envs.kuhn_poker import KuhnPoker
from grpokit.envs.selfplay import GameRunner, game_metrics
from grpokit.eval.games import kuhn_exploitability
from grpokit.rollout.records import Samples, Scores
from grpokit.train.hooks import StepHook

__all__ = ["SelfPlay", "SnapshotPool", "game_yardstick"]


def game_yardstick(
    game: GameRunner, model: torch.nn.Module, tokenizer: Any, prompt_ids: list[int],
    autocast: Callable[[], AbstractContextManager[Any]],
) -> Callable[[], dict[str, float]] | None:  # fmt: skip
    """What a game run measures on its policy after each update: Kuhn poker's exact exploitability, read from
    ``model``'s log-probabilities after ``prompt_ids`` (``eval.games``) under ``autocast``; None for other
    games."""
    if not issubclass(game.game_type, KuhnPoker):
        return None

    def measure() -> dict[str, float]:
        with autocast():
            return {"selfplay/exploitability": kuhn_exploitability(model, tokenizer, prompt_ids)}

    return measure


class SnapshotPool:
    """The newest ``size`` snapshots of a model's weights, ``(step, state)`` with the state on the CPU."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.snapshots: list[tuple[int, dict[str, torch.Tensor]]] = []

    def take(self, step: int, model: torch.nn.Module) -> None:
        state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        self.snapshots = [*self.snapshots, (step, state)][-self.size :]

    def draw(self) -> tuple[int, dict[str, torch.Tensor]]:
        """One snapshot, uniformly (torch's random state)."""
        return self.snapshots[int(torch.randint(len(self.snapshots), (1,)).item())]

    def state_dict(self) -> list[tuple[int, dict[str, torch.Tensor]]]:
        return list(self.snapshots)

    def load_state_dict(self, state: list[tuple[int, dict[str, torch.Tensor]]]) -> None:
        self.snapshots = [(int(step), weights) for step, weights in state][-self.size :]


class SelfPlay(StepHook):
    """The game side of a run's steps (module docstring).

    Args:
        runner: the run's game runner (its roles and game name; ``"pool"``: its ``opponent_model`` is set
            here).
        args: the run's config (``role_advantage``, ``rae_decay``, ``scale_rewards``, ``snapshot_*``, ...).
        yardstick: ``() -> {metric: value}`` measured on the policy after each update (every process calls
            it), or None.
        policy: the policy (unwrapped) whose snapshots the pool keeps (``"pool"`` only).
        placement: how the policy is placed (``"ddp"``, ``"fsdp"``, ``"zero"``): the pool needs whole
            weights on every process (DDP).
    """

    checkpoint_key = "selfplay"

    def __init__(
        self, runner: GameRunner, args: Any, yardstick: Callable[[], dict[str, float]] | None = None,
        policy: torch.nn.Module | None = None, placement: str = "ddp",
    ) -> None:  # fmt: skip
        roles = runner.num_roles
        for name in ("num_generations", "num_generations_eval"):
            value = getattr(args, name)
            if value is not None and value % roles:
                raise InputError(
                    f"GRPOConfig.{name}={value}: a prompt's episodes are the seats of {runner.name}'s "
                    f"{roles} roles; give a multiple of {roles}"
                )
        self.runner, self.args, self.yardstick = runner, args, yardstick
        self.baselines = RoleBaselines(args.rae_decay) if args.role_advantage == "rae" else None
        self._metrics: dict[str, float] = {}
        self.pool: SnapshotPool | None = None
        self.policy, self._opponent = policy, None
        self._opponent_step = -1
        if runner.opponent == "pool":
            if placement != "ddp":
                raise InputError(
                    f"GRPOConfig.game_opponent='pool' with {placement}: a snapshot is a copy of the whole "
                    "policy and a sharded policy has none on a process; use DDP (or a scripted opponent)"
                )
            if policy is None:
                raise ValueError("game_opponent='pool' needs the policy to take snapshots of")
            self.pool = SnapshotPool(args.snapshot_pool_size)
            self.pool.take(0, policy)
            runner.opponent_model = self.opponent_model

    def opponent_model(self) -> torch.nn.Module:
        """A copy of the policy holding a snapshot drawn from the pool: the other seats of a step's games."""
        assert self.pool is not None and self.policy is not None
        step, state = self.pool.draw()
        if self._opponent is None:
            self._opponent = copy.deepcopy(self.policy).eval().requires_grad_(False)
        self._opponent.load_state_dict(state)
        self._opponent_step = step
        return self._opponent

    def advantages(self, rewards: torch.Tensor, weights: Any, group_sizes: Sequence[int]) -> torch.Tensor:
        """rewards: [N, F] of every process's episodes (prompt groups of ``group_sizes``, role-major) -> [N]
        advantages: by role groups, against the role baselines (``rae``), or by prompt (``prompt``)."""
        if self.baselines is None:
            roles = 1 if self.args.role_advantage == "prompt" else self.runner.num_roles  # prompt: ablation
            return multi_reward_advantages(
                rewards, weights, group_sizes=role_group_sizes(group_sizes, roles),
                scale=self.args.scale_rewards, aggregation=self.args.multi_objective_aggregation,
                eps=self.args.advantage_epsilon,
            )  # fmt: skip
        roles, game = self.runner.roles, self.runner.name
        keys = [f"{game}/{roles[i * len(roles) // size]}" for size in group_sizes for i in range(size)]
        return self.baselines.advantages(keys, combine_rewards(rewards, weights))

    def on_scored(self, step: int, samples: Samples, scores: Scores) -> None:
        self._metrics = game_metrics(samples.episodes or [], self.runner.roles)

    def after_update(self, step: int) -> None:
        if self.pool is not None:
            self._metrics["selfplay/opponent_step"] = float(self._opponent_step)
            if step % self.args.snapshot_every == 0:
                self.pool.take(step, self.policy)  # type: ignore[arg-type]
            self._metrics["selfplay/pool_size"] = float(len(self.pool.snapshots))
        if self.yardstick is not None:
            self._metrics.update(self.yardstick())

    def metrics(self) -> dict[str, float]:
        return self._metrics

    def state_dict(self) -> Any:
        baselines = None if self.baselines is None else self.baselines.state_dict()
        return {"baselines": baselines, "pool": None if self.pool is None else self.pool.state_dict()}

    def load_state_dict(self, state: Any) -> None:
        """The checkpoint's baselines and snapshots; the decay is this run's ``rae_decay`` (a resume may
        change it)."""
        if self.baselines is not None and state.get("baselines") is not None:
            self.baselines.load_state_dict(state["baselines"])
            self.baselines.alpha = self.args.rae_decay
        if self.pool is not None and state.get("pool") is not None:
            self.pool.load_state_dict(state["pool"])
