"""Multi-turn episodes: G episodes per prompt, the policy and an environment taking turns.

Every episode's completion is everything after its prompt: the policy's turns (each ended by EOS or a token
limit) and the environment's observations between them. ``policy_mask`` tells them apart: 1 on the
policy's tokens, 0 on the environment's, which are context only (masked out of the loss and the KL by
``train.batch.pad_samples``). An episode ends when the environment says ``done``, after ``max_turns``
policy turns, or when the next turn would not fit in ``max_tokens`` (the last two are *truncated*,
following ``mask_truncated_completions``). Generation goes through a turn session
(``grpokit.envs.turns``): the fast sampler's model appends each turn to its key/value cache, any other
backend re-reads the context.

An environment call that raises or outlives ``timeout`` is a failure of that episode: with
``on_error="raise"`` it raises :class:`EnvironmentFailure` naming the episode, the turn and the cause; with
``"none"`` the episode ends, its environment reward is None (skipped, as a failing reward function's value)
and it is counted in ``env/failures``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from grpokit.envs.base import as_turn
from grpokit.envs.bounded import BoundedCaller
from grpokit.envs.observations import ObservationEncoder
from grpokit.envs.turns import TurnSession
from grpokit.rollout.base import GenerationOutput, SamplingParams

__all__ = [
    "EnvironmentFailure",
    "Episode",
    "EpisodeRunner",
    "as_generation_output",
    "episode_columns",
    "episode_metrics",
    "turn_texts",
    "with_episode_columns",
]


class EnvironmentFailure(RuntimeError):
    """An environment raised or hung (``reward_failure="raise"``)."""


@dataclass
class Episode:
    """One episode: its tokens and what the environment said."""

    completion_ids: list[int] = field(default_factory=list)
    """Every token after the prompt: policy turns and observations."""
    policy_mask: list[int] = field(default_factory=list)
    """1 on the policy's tokens, 0 on the environment's."""
    logprobs: list[float] = field(default_factory=list)
    """Sampling log-prob of each policy token; 0.0 on environment tokens."""
    actions: list[str] = field(default_factory=list)
    """Each policy turn decoded (without special tokens)."""
    turn_ends: list[int] = field(default_factory=list)
    """Index (in ``completion_ids``) of the last token of each policy turn."""
    turn_rewards: list[float | None] = field(default_factory=list)
    """The environment's reward for each policy turn (None where it gave none)."""
    info: Counter = field(default_factory=Counter)
    """The turns' ``info`` counters, summed."""
    done: bool = False
    """The environment ended the episode."""
    truncated: bool = False
    """Cut by ``max_turns`` or the token budget before the environment ended it."""
    failure: str | None = None
    """Why the environment failed (raised or hung), or None."""
    seat: str | None = None
    """The role the policy played (a game's episode: ``grpokit.envs.selfplay``), or None."""

    def add_turn(self, tokens: list[int], logprobs: list[float]) -> None:
        """Append a policy turn (its tokens and their sampling log-probs)."""
        self.completion_ids += tokens
        self.policy_mask += [1] * len(tokens)
        self.logprobs += logprobs
        self.turn_ends.append(len(self.completion_ids) - 1)

    def add_observation(self, tokens: list[int]) -> None:
        """Append the environment's tokens (context: mask 0, log-prob 0.0)."""
        self.completion_ids += tokens
        self.policy_mask += [0] * len(tokens)
        self.logprobs += [0.0] * len(tokens)

    def turn_limit(self, max_tokens: int, max_turn_tokens: int | None) -> int:
        """Tokens the next policy turn may take: what is left of ``max_tokens``, at most ``max_turn_tokens``
        (None: no bound of its own)."""
        left = max_tokens - len(self.completion_ids)
        return max(1, min(left, max_turn_tokens or left))

    @property
    def reward(self) -> float | None:
        """The summed turn rewards; None when no turn had one or the environment failed."""
        values = [r for r in self.turn_rewards if r is not None]
        return None if self.failure is not None or not values else float(sum(values))


class EpisodeRunner:
    """Runs episodes for one run: its environment factory, tokenizer and limits.

    Args:
        make_env: a no-argument factory of fresh environments (``grpokit.envs.make_environment_factory``).
        tokenizer: decodes actions, encodes observations.
        chat: whether the prompts are chat messages (observations then go through the chat template).
        max_turns: policy turns per episode at most.
        max_tokens: completion tokens (policy + environment) per episode at most.
        max_turn_tokens: policy tokens per turn at most (None: what is left of ``max_tokens``).
        timeout: seconds one ``reset``/``step`` call may take (None: unbounded).
        on_error: ``"raise"`` or ``"none"`` (module docstring).
    """

    def __init__(
        self,
        make_env: Callable[[], Any],
        tokenizer: Any,
        *,
        chat: bool = False,
        max_turns: int,
        max_tokens: int,
        max_turn_tokens: int | None = None,
        timeout: float | None = 30.0,
        on_error: str = "raise",
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.make_env, self.tokenizer = make_env, tokenizer
        self.encoder = ObservationEncoder(tokenizer, chat, chat_template_kwargs)
        self.max_turns, self.max_tokens, self.max_turn_tokens = max_turns, max_tokens, max_turn_tokens
        self.caller = BoundedCaller(timeout)
        self.on_error = on_error
        self.template_kwargs = _tool_schemas(make_env()) if chat else {}
        """Chat-template variables for the prompts: ``tools`` (the environment's ``schemas()``, as chat
        templates take them) when the prompts are chat messages and the environment has tools."""

    @classmethod
    def for_rows(
        cls,
        environment: Any,
        tokenizer: Any,
        rows: Sequence[dict[str, Any]],
        *,
        environment_kwargs: dict[str, Any] | None = None,
        **settings: Any,
    ) -> EpisodeRunner:
        """A runner for ``rows``' episodes in ``environment`` (a name, import path, class, factory or step
        function: ``grpokit.envs.make_environment_factory``); observations go through the chat template when
        the rows' prompts are chat messages. ``settings``: the other arguments of the constructor."""
        from grpokit.data.chat import is_conversational
        from grpokit.envs import make_environment_factory

        chat = bool(rows) and is_conversational(rows[0]["prompt"])
        factory = make_environment_factory(environment, environment_kwargs)
        return cls(factory, tokenizer, chat=chat, **settings)

    def run(
        self, session: TurnSession, rows: Sequence[dict[str, Any]], params: SamplingParams
    ) -> list[Episode]:
        """One episode per row (rows in the session's episode order: G per prompt, grouped)."""
        envs = [self.make_env() for _ in rows]
        episodes = [Episode() for _ in rows]
        outcomes = self.caller.run([lambda e=env, r=row: e.reset(r) for env, row in zip(envs, rows)])
        live = [i for i, out in enumerate(outcomes) if not self._failed(episodes[i], out, i, "reset")]
        for turn in range(self.max_turns):
            if not live:
                break
            limits = [episodes[i].turn_limit(self.max_tokens, self.max_turn_tokens) for i in live]
            turns = dict(zip(live, session.act(live, params, limits)))
            for i, (tokens, logprobs, _) in turns.items():
                episodes[i].add_turn(tokens, logprobs)
            # a turn cut by the episode's token budget is no complete action: the episode is truncated
            stepping = [i for i in live if turns[i][2] or len(episodes[i].completion_ids) < self.max_tokens]
            for i in set(live) - set(stepping):
                episodes[i].truncated = True
            texts = turn_texts(self.tokenizer, [turns[i] for i in stepping], params)
            steps = self.caller.run([lambda e=envs[i], a=a: e.step(a) for i, a in zip(stepping, texts)])
            feeds: dict[int, list[int]] = {}
            for i, action, out in zip(stepping, texts, steps):
                episode = episodes[i]
                episode.actions.append(action)
                if self._failed(episode, out, i, f"turn {turn + 1}"):
                    continue
                result = as_turn(out)
                episode.turn_rewards.append(None if result.reward is None else float(result.reward))
                episode.info.update(result.info)
                if result.done:
                    episode.done = True
                    continue
                role = getattr(envs[i], "observation_role", "user")
                observation = self.encoder(result.observation, role)
                if (
                    turn + 1 == self.max_turns
                    or len(episode.completion_ids) + len(observation) >= self.max_tokens
                ):
                    episode.truncated = True
                    continue
                episode.add_observation(observation)
                feeds[i] = observation
            live = sorted(feeds)
            if live:
                session.observe(feeds)
        return episodes

    # ------------------------------------------------------------------ helpers
    def _failed(self, episode: Episode, outcome: Any, index: int, where: str) -> bool:
        """Apply the failure policy to an environment call's outcome; True when the episode failed."""
        if not isinstance(outcome, BaseException):
            return False
        message = f"{type(outcome).__name__}: {outcome}"
        if self.on_error == "raise":
            raise EnvironmentFailure(
                f"environment failed in episode {index} at {where}: {message}"
            ) from outcome
        episode.failure = f"{where}: {message}"
        return True


def turn_texts(tokenizer: Any, turns: Sequence[tuple[list[int], list[float], bool]], params: SamplingParams
               ) -> list[str]:  # fmt: skip
    """Each turn's tokens (``TurnOutput``) as text, without the EOS that ended it."""
    eos = set(params.eos_token_ids)
    tokens = [ids[:-1] if ids and ids[-1] in eos else ids for ids, _, _ in turns]
    return tokenizer.batch_decode(tokens, skip_special_tokens=True)


def _tool_schemas(env: Any) -> dict[str, Any]:
    schemas = getattr(env, "schemas", None)
    listed = schemas() if callable(schemas) else None
    return {"tools": listed} if listed else {}  # (no tools: no ``tools=[]``, which some templates render)


def as_generation_output(episodes: Sequence[Episode]) -> GenerationOutput:
    """The episodes as a ``GenerationOutput`` with ``policy_mask`` set."""
    return GenerationOutput(
        completion_ids=[e.completion_ids for e in episodes],
        logprobs=[e.logprobs for e in episodes],
        truncated=[e.truncated for e in episodes],
        policy_mask=[e.policy_mask for e in episodes],
    )


def episode_columns(episodes: Sequence[Episode]) -> list[dict[str, Any]]:
    """Per episode, the columns added to its row for reward functions: ``env_reward`` (summed turn rewards or
    None), ``env_turn_rewards``, ``env_actions``, ``env_info`` (summed counters), ``env_done``."""
    return [
        {
            "env_reward": e.reward,
            "env_turn_rewards": list(e.turn_rewards),
            "env_actions": list(e.actions),
            "env_info": dict(e.info),
            "env_done": e.done,
        }
        for e in episodes
    ]


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """``env/reward`` (mean over episodes with one), ``env/turns``, ``env/done``, ``env/truncated``,
    ``env/failures`` (count), ``env/policy_tokens``, ``env/env_tokens`` and ``env/<counter>`` (mean per
    episode of every ``info`` counter). Episodes that count tool calls (``tool_calls``, ``tool_errors``:
    ``grpokit.envs.tools``) also give TRL's names: ``tools/call_frequency`` (calls per episode, the same
    value as ``env/tool_calls``) and ``tools/failure_frequency`` (failed calls / calls; 0 without calls)."""
    if not episodes:
        return {}
    n = len(episodes)
    rewards = [e.reward for e in episodes if e.reward is not None]
    out = {
        "env/reward": sum(rewards) / len(rewards) if rewards else math.nan,
        "env/turns": sum(len(e.actions) for e in episodes) / n,
        "env/done": sum(e.done for e in episodes) / n,
        "env/truncated": sum(e.truncated for e in episodes) / n,
        "env/failures": float(sum(e.failure is not None for e in episodes)),
        "env/policy_tokens": sum(sum(e.policy_mask) for e in episodes) / n,
        "env/env_tokens": sum(len(e.policy_mask) - sum(e.policy_mask) for e in episodes) / n,
    }
    keys = sorted({key for e in episodes for key in e.info})
    out.update({f"env/{key}": sum(e.info.get(key, 0) for e in episodes) / n for key in keys})
    if "tool_calls" in keys:
        calls = sum(e.info.get("tool_calls", 0) for e in episodes)
        errors = sum(e.info.get("tool_errors", 0) for e in episodes)
        out["tools/call_frequency"] = calls / n
        out["tools/failure_frequency"] = errors / calls if calls else 0.0
    return out


def with_episode_columns(rows: Sequence[dict[str, Any]], episodes: Sequence[Episode]) -> list[dict[str, Any]]:
    """Each row with its episode's columns (:func:`episode_columns`) added."""
    return [{**row, **columns} for row, columns in zip(rows, episode_columns(episodes))]
