"""A run that plays a game (``grpokit.envs.selfplay``): role-wise advantages, ``selfplay/*`` metrics, and the
exact yardstick where the game has one.

- **Advantages.** A prompt's episodes are its roles' seats, role-major, so ``role_advantage="group"`` is the
  usual group advantage over each prompt's group split by role (``core.role_group_sizes``). ``"rae"``
  replaces it by SPIRAL's role-conditioned baselines (``core.RoleBaselines``), read and updated over every
  process's episodes in the same order, so every process holds the same baselines; they are checkpointed.
  ``"prompt"`` (an ablation) is plain GRPO's group: every seat of a prompt against one baseline.
- **Metrics.** ``selfplay/*`` of the step's episodes (``envs.selfplay.game_metrics``) and, for Kuhn poker,
  ``selfplay/exploitability``: the exact exploitability of the policy's strategy read from its
  log-probabilities after the step's update (``eval.games``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from grpokit.core import RoleBaselines, combine_rewards, multi_reward_advantages, role_group_sizes
from grpokit.data.integrity import InputError
from grpokit.envs.selfplay import GameRunner, game_metrics
from grpokit.rollout.records import Samples, Scores
from grpokit.train.hooks import StepHook

__all__ = ["SelfPlay"]


class SelfPlay(StepHook):
    """The game side of a run's steps (module docstring).

    Args:
        runner: the run's game runner (its roles and game name).
        args: the run's config (``role_advantage``, ``rae_decay``, ``scale_rewards``, ...).
        yardstick: ``() -> {metric: value}`` measured on the policy after each update (every process calls
            it), or None.
    """

    checkpoint_key = "selfplay"

    def __init__(
        self, runner: GameRunner, args: Any, yardstick: Callable[[], dict[str, float]] | None = None
    ) -> None:
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
        if self.yardstick is not None:
            self._metrics.update(self.yardstick())

    def metrics(self) -> dict[str, float]:
        return self._metrics

    def state_dict(self) -> Any:
        return None if self.baselines is None else self.baselines.state_dict()

    def load_state_dict(self, state: Any) -> None:
        """The checkpoint's baselines; the decay is this run's ``rae_decay`` (a resume may change it)."""
        if self.baselines is not None:
            self.baselines.load_state_dict(state)
            self.baselines.alpha = self.args.rae_decay
