"""A run's environment: episodes instead of single completions (``grpokit.envs.episodes``), their metrics
and, with ``turn_advantages``, per-turn rewards as process supervision.

The trainer asks :meth:`EnvironmentEpisodes.generate` where it would call ``generate_groups``; the episodes'
columns (``env_reward``, ``env_actions``, ...) join each row, so reward functions read them like any column,
and the built-in ``environment_reward`` is the environment's own reward. As a step hook it logs ``env/*``
and, with ``turn_advantages``, replaces the outcome advantages by per-token ones: each policy turn is a
step whose reward is the environment's reward for that turn (0 where it gave none), normalised within the
group (``grpokit.core.process_advantages``), plus the outcome advantage, as process supervision does.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from grpokit.envs.episodes import (
    Episode,
    EpisodeRunner,
    as_generation_output,
    episode_metrics,
    with_episode_columns,
)
from grpokit.envs.tools import ToolEnvironment
from grpokit.envs.turns import open_session
from grpokit.rollout import RolloutBackend, SamplingParams, generate_groups
from grpokit.rollout.base import GenerationOutput
from grpokit.rollout.records import RolloutBatch, Samples, Scores
from grpokit.train.hooks import StepHook
from grpokit.train.process_supervision import token_abs_mean, token_advantages

__all__ = ["EnvironmentEpisodes", "sample_groups", "template_kwargs"]


class EnvironmentEpisodes(StepHook):
    """The run's episode runner and what it reports (module docstring)."""

    def __init__(self, runner: EpisodeRunner, args: Any) -> None:
        self.runner, self.args = runner, args
        self._metrics: dict[str, float] = {}
        self._episodes: list[Episode] = []

    @classmethod
    def for_run(
        cls, args: Any, environment: Any, tokenizer: Any, rows: Sequence[dict[str, Any]], tools: Any = None
    ) -> Any:
        """None unless the run has an environment: ``environment`` given to the trainer, else TRL's
        ``tools`` (a ``ToolEnvironment`` over them, at most ``max_tool_calling_iterations`` calling turns),
        else ``args.environment``."""
        spec = environment if environment is not None else args.environment
        max_turns = args.max_turns
        if tools:
            if spec is not None:
                raise ValueError("GRPOTrainer: give tools= or an environment, not both (a ToolEnvironment "
                                 "subclass can hold tools and state)")  # fmt: skip
            spec = functools.partial(ToolEnvironment, list(tools))
            if args.max_tool_calling_iterations is not None:
                max_turns = args.max_tool_calling_iterations + 1
        if spec is None:
            if args.turn_advantages:
                raise ValueError("GRPOConfig.turn_advantages needs an environment (its per-turn rewards)")
            return None
        runner = EpisodeRunner.for_rows(
            spec,
            tokenizer,
            rows,
            environment_kwargs=args.environment_kwargs,
            max_turns=max_turns,
            max_tokens=args.max_completion_length,
            max_turn_tokens=args.max_turn_tokens,
            timeout=args.environment_timeout,
            on_error=args.reward_failure,
            chat_template_kwargs=args.chat_template_kwargs,
        )
        return cls(runner, args)

    def generate(
        self,
        backend: RolloutBackend,
        rows: list[dict[str, Any]],
        prompt_ids: list[list[int]],
        sizes: list[int],
        params: SamplingParams,
    ) -> tuple[GenerationOutput, list[dict[str, Any]], list[Episode]]:
        """``sizes[k]`` episodes from each prompt: the completions (with ``policy_mask``), the rows (one
        per episode) with the episodes' columns, and the episodes."""
        session = open_session(backend, prompt_ids, sizes)
        episode_rows = [row for row, size in zip(rows, sizes) for _ in range(size)]
        episodes = self.runner.run(session, episode_rows, params)
        return as_generation_output(episodes), with_episode_columns(episode_rows, episodes), episodes

    # ------------------------------------------------------------------ step hook
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


def sample_groups(
    environment: EnvironmentEpisodes | None,
    backend: RolloutBackend,
    rows: list[dict[str, Any]],
    prompt_ids: list[list[int]],
    sizes: list[int],
    params: SamplingParams,
) -> tuple[GenerationOutput, list[dict[str, Any]], list[Episode] | None]:
    """``sizes[k]`` completions of prompt k (``generate_groups``), or with an environment ``sizes[k]``
    episodes: (the completions, one row per completion, the episodes or None)."""
    if environment is None:
        generated = generate_groups(backend, prompt_ids, sizes, params)
        return generated, [row for row, size in zip(rows, sizes) for _ in range(size)], None
    return environment.generate(backend, rows, prompt_ids, sizes, params)


def template_kwargs(environment: EnvironmentEpisodes | None, kwargs: dict[str, Any] | None) -> Any:
    """``chat_template_kwargs`` with an environment's tool schemas added (``tools``; the user's win)."""
    if environment is None or not environment.runner.template_kwargs:
        return kwargs
    return {**environment.runner.template_kwargs, **(kwargs or {})}
