"""Process supervision, step hooks: score every step of every completion, then turn the step rewards into
per-token advantages [n, C], combined with the outcome advantages (:class:`ProcessSupervision`); an
environment's per-turn rewards as the step rewards of its episodes (:class:`EpisodeSupervision`).

DeepSeekMath (arXiv:2402.03300) section 4.1.3; docs/process-supervision.md. For the n local completions
(whole groups of G), with C the padded completion width of the RolloutBatch:

    A_process = process_advantages(step_rewards, step_ends, G, C)              # [n, C], pooled per group
    A[i, t]   = mask[i, t] * (outcome_advantage_weight * A_outcome[i]
                              + process_advantage_weight * A_process[i, t])      # [n, C]

``A_outcome`` is the usual group advantage of the outcome rewards (``reward_funcs``; 0 for a group whose
outcome rewards are all equal or missing), so ``outcome_advantage_weight = 0`` is pure process supervision.
Step rewards are always normalised within their group (``scale_rewards`` applies to the outcome part only).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from grpokit.config import GRPOConfig
from grpokit.core import combine_outcome_and_process, process_advantages, resolve_group_sizes
from grpokit.data.chat import as_completion
from grpokit.data.loading import reward_columns
from grpokit.envs.episodes import Episode, episode_metrics
from grpokit.reporting.proxy_gold import GoldWatch
from grpokit.rewards.process_rewards import (
    ProcessRewardModel,
    ProcessScores,
    resolve_process_reward_funcs,
    score_process,
)
from grpokit.rewards.scoring import reward_names, reward_weights
from grpokit.rollout.records import RolloutBatch, Samples, Scores
from grpokit.train.hooks import StepHook

__all__ = ["EpisodeSupervision", "ProcessSupervision", "token_abs_mean", "token_advantages"]


class ProcessSupervision(StepHook):
    """The process reward functions of a run and how their step rewards become token advantages.

    ``specs``: callables ``fn(prompts, completions, steps, **columns) -> list[list[float] | None]``,
    built-in verifier names (``"chain_steps"``) or process-reward-model directories (loaded as
    ``ProcessRewardModel`` on ``device``). Weights: ``args.process_reward_weights`` (default all 1.0).
    Failures follow ``args.reward_failure``, as for outcome rewards.
    """

    def __init__(
        self, specs: Sequence[Any], args: GRPOConfig, tokenizer: Any, device: torch.device | str | None = None
    ) -> None:
        if not specs:
            raise ValueError("process_reward_funcs: give at least one process reward function")
        self.args = args
        self.tokenizer = tokenizer
        self.funcs = resolve_process_reward_funcs(list(specs), delimiter=args.step_delimiter, device=device)
        for fn in self.funcs:
            if isinstance(fn, ProcessRewardModel) and device is not None:
                fn.model.to(device)
        self.names = reward_names(self.funcs)
        self.weights = reward_weights(args.process_reward_weights, self.names, "process_reward_weights")
        self._scores: ProcessScores | None = None
        self._metrics: dict[str, float] = {}
        self.gold: GoldWatch | None = None
        """A watching gold reward (``GRPOConfig.gold_reward``): ``proxy_gold/*`` with these process rewards as
        the proxy (set by the run's rewards)."""
        self._gold_metrics: dict[str, float] = {}

    def on_scored(self, step: int, samples: Samples, scores: Scores) -> None:
        """Step rewards and step end tokens of this process's n completions; with a gold reward, the
        ``proxy_gold/*`` metrics of those completions."""
        rows = samples.rows
        self._scores = score_process(
            self.funcs,
            [row["prompt"] for row in rows],
            [as_completion(text, row["prompt"]) for row, text in zip(rows, samples.texts)],
            samples.generated.completion_ids,
            self.tokenizer,
            reward_columns(rows),
            self.args.step_delimiter,
            weights=self.weights,
            on_error=self.args.reward_failure,
            timeout=self.args.reward_timeout,
        )
        if self.gold is not None:
            local = scores.rewards[scores.local]  # [n, F] this process's rows
            sizes = _local_group_sizes(scores, self.args.num_generations)
            self._gold_metrics = self.gold.process_metrics(self._scores.step_rewards, local, sizes)

    def on_batch(self, batch: RolloutBatch) -> None:
        """batch.advantages: the outcome advantages [n] -> token advantages [n, C] (module docstring)."""
        batch.advantages = self.advantages(self._scores, batch.advantages, batch.completion_mask)
        self._metrics = self.step_metrics(self._scores, batch.advantages, batch.completion_mask)

    def metrics(self) -> dict[str, float]:
        return {**self._metrics, **self._gold_metrics}

    def advantages(
        self, scores: ProcessScores, outcome_advantages: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Per-token advantages [n, C] (see the module docstring). outcome_advantages: [n]; mask: [n, C]."""
        return token_advantages(scores.step_rewards, scores.step_ends, outcome_advantages, mask, self.args)

    @staticmethod
    def step_metrics(scores: ProcessScores, advantages: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
        """``process_reward`` (mean weighted step reward over all steps), ``process_rewards/<name>/mean``,
        ``.../step_count``, ``.../failures``, ``process_rewards/num_steps/mean`` and
        ``advantages/token_abs_mean``."""
        values = [v for row in scores.step_rewards for v in row]
        return {
            "process_reward": sum(values) / len(values) if values else math.nan,
            **scores.metrics(),
            "advantages/token_abs_mean": token_abs_mean(advantages, mask),
        }


def _local_group_sizes(scores: Scores, group_size: int) -> list[int]:
    """The sizes of the groups within ``scores.local`` (groups are contiguous and never split between
    processes); ``scores.group_sizes`` when given, else groups of ``group_size``."""
    ragged = scores.group_sizes
    sizes = resolve_group_sizes(len(scores.rewards), None if ragged else group_size, ragged)
    local, out, start = scores.local, [], 0
    for size in sizes:
        if local.start <= start and start + size <= local.stop:
            out.append(size)
        start += size
    return out


class EpisodeSupervision(StepHook):
    """A run's episodes in the step: their ``env/*`` metrics and, with ``turn_advantages``, their per-turn
    rewards as process supervision. Each policy turn is a step whose reward is the environment's reward for
    that turn (0 where it gave none), normalised within the group, plus the outcome advantage
    (:func:`token_advantages`, as for process rewards)."""

    def __init__(self, args: GRPOConfig) -> None:
        self.args = args
        self._metrics: dict[str, float] = {}
        self._episodes: list[Episode] = []

    @classmethod
    def for_run(cls, args: GRPOConfig, has_environment: bool) -> EpisodeSupervision | None:
        """The hook of a run with an environment; None without one (``turn_advantages`` then refused)."""
        if has_environment:
            return cls(args)
        if args.turn_advantages:
            raise ValueError("GRPOConfig.turn_advantages needs an environment (its per-turn rewards)")
        return None

    def on_scored(self, step: int, samples: Samples, scores: Scores) -> None:
        self._episodes = list(samples.episodes or [])
        self._metrics = episode_metrics(self._episodes)

    def on_batch(self, batch: RolloutBatch) -> None:
        """``turn_advantages``: outcome advantages [n] -> token advantages [n, C] from the turn rewards."""
        if not self.args.turn_advantages or not self._episodes:
            return
        rewards = [[0.0 if r is None else r for r in e.turn_rewards] for e in self._episodes]
        ends = [e.turn_ends[: len(r)] for e, r in zip(self._episodes, rewards)]  # turns the env answered
        batch.advantages = token_advantages(rewards, ends, batch.advantages, batch.completion_mask, self.args)
        self._metrics["advantages/token_abs_mean"] = token_abs_mean(batch.advantages, batch.completion_mask)

    def metrics(self) -> dict[str, float]:
        return self._metrics


def token_advantages(
    step_rewards: Sequence[Sequence[float]],
    step_ends: Sequence[Sequence[int]],
    outcome_advantages: torch.Tensor,
    mask: torch.Tensor,
    args: Any,
) -> torch.Tensor:
    """Token advantages [n, C] from step rewards (the step ending at token ``step_ends[i][j]`` of
    completion i), normalised within each group of ``num_generations``, combined with the outcome
    advantages [n] by ``outcome_advantage_weight`` / ``process_advantage_weight`` (module docstring).
    Shared by process rewards and by an environment's per-turn rewards (:class:`EpisodeSupervision`)."""
    process = process_advantages(
        step_rewards,
        step_ends,
        args.num_generations,
        max(1, mask.shape[1]),
        eps=args.advantage_epsilon,
        device=mask.device,
    )  # [n, C]
    return combine_outcome_and_process(
        outcome_advantages.to(mask.device),
        process[:, : mask.shape[1]],
        mask,
        outcome_weight=args.outcome_advantage_weight,
        process_weight=args.process_advantage_weight,
    )  # [n, C]


def token_abs_mean(advantages: torch.Tensor, mask: torch.Tensor) -> float:
    """``advantages/token_abs_mean``: mean |A| over the masked tokens of [n, C] advantages."""
    m = mask.float()
    return float((advantages.abs() * m).sum() / m.sum().clamp(min=1))
