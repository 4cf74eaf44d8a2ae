"""A run's episodes as its completions: where a step would sample G completions of a prompt, an environment
run plays G episodes (``grpokit.envs.episodes``).

The episodes' columns (``env_reward``, ``env_actions``, ...) join each row, so reward functions read them
like any column, and the built-in ``environment_reward`` is the environment's own reward.
:func:`sample_groups` is what a step calls either way: ``rollout.generate_groups`` without an environment,
:meth:`EpisodeSampler.generate` with one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpokit.data.integrity import InputError
from grpokit.envs import game_factory
from grpokit.envs.episodes import Episode, EpisodeRunner, as_generation_output, with_episode_columns
from grpokit.envs.factories import EnvironmentFactories
from grpokit.envs.selfplay import GameRunner
from grpokit.envs.tools import ToolEnvironment
from grpokit.envs.turns import open_session
from grpokit.rollout import RolloutBackend, SamplingParams, generate_groups
from grpokit.rollout.base import GenerationOutput

if TYPE_CHECKING:
    from grpokit.models.vision import PromptImages

__all__ = [
    "EpisodeSampler",
    "EpisodeSettings",
    "refuse_unused_environment_kwargs",
    "sample_groups",
    "start_episodes",
    "template_kwargs",
]


@dataclass(frozen=True)
class EpisodeSettings:
    """How a run's episodes run (the environment fields of ``GRPOConfig``, docs/environments.md)."""

    environment: Any = None
    """The environment when the trainer is given none: a built-in name or an import path; None: none."""
    environment_kwargs: dict[str, Any] = field(default_factory=dict)
    max_turns: int = 8
    max_tokens: int = 256
    """Completion tokens (policy and environment) per episode at most (``max_completion_length``)."""
    max_turn_tokens: int | None = None
    timeout: float | None = 30.0
    on_error: str = "raise"
    """``reward_failure``: an environment that raises or hangs raises, or ends its episode ("none")."""
    chat_template_kwargs: dict[str, Any] | None = None
    max_tool_calling_iterations: int | None = None
    """With TRL's ``tools``: tool-calling turns per episode at most (then ``max_turns`` is this + 1)."""
    game_opponent: str = "self"
    """A game's other seats (``grpokit.envs.selfplay``): the policy itself, or a scripted player."""
    illegal_move_reward: float = -1.5
    """A game's return for the seat whose turn names no legal move."""


def refuse_unused_environment_kwargs(kwargs: Any) -> None:
    """``environment_kwargs`` in a run without an environment would configure nothing: refused."""
    if kwargs:
        raise InputError(
            f"GRPOConfig.environment_kwargs={dict(kwargs)!r} given, but the run has no environment: set "
            "environment (a built-in name such as maze, or an import path), or drop environment_kwargs"
        )


class EpisodeSampler:
    """G episodes per prompt through a rollout backend: the run's episode runner, or its game runner (a
    game's seats, ``grpokit.envs.selfplay``)."""

    def __init__(
        self, runner: EpisodeRunner | GameRunner, factories: EnvironmentFactories | None = None
    ) -> None:
        self.runner = runner
        self.factories = factories
        """TRL's ``environment_factory`` (``grpokit.envs.factories``), or None."""

    @property
    def game(self) -> GameRunner | None:
        """The game runner when the run plays a game, else None."""
        return self.runner if isinstance(self.runner, GameRunner) else None

    @property
    def num_roles(self) -> int:
        """A game's roles (each its own advantage group within a prompt's episodes); 1 otherwise."""
        return self.game.num_roles if self.game is not None else 1

    @classmethod
    def for_run(
        cls,
        environment: Any,
        tools: Sequence[Callable[..., Any]] | None,
        rows: Sequence[dict[str, Any]],
        tokenizer: Any,
        settings: EpisodeSettings,
        factories: EnvironmentFactories | None = None,
    ) -> EpisodeSampler | None:
        """None unless the run has an environment: TRL's ``environment_factory`` (``factories``, with
        ``tools`` added to each environment's), else ``environment`` (given to the trainer), else TRL's
        ``tools`` (a ``ToolEnvironment`` over them), else ``settings.environment``. With TRL's two, at most
        ``max_tool_calling_iterations`` tool-calling turns, and a malformed call is no call (TRL's
        reading: the episode's last action)."""
        spec = environment if environment is not None else settings.environment
        max_turns = settings.max_turns
        if factories is not None:
            if spec is not None:
                raise ValueError("GRPOTrainer: give environment_factory= (TRL's protocol) or an environment "
                                 "(grpokit's), not both")  # fmt: skip
            if settings.environment_kwargs:
                raise ValueError("environment_kwargs configures grpokit's environments; environment_factory "
                                 "builds its own (bind arguments with functools.partial)")  # fmt: skip
            spec = factories.make_env
        elif tools:
            if spec is not None:
                raise ValueError("GRPOTrainer: give tools= or an environment, not both (a ToolEnvironment "
                                 "subclass can hold tools and state)")  # fmt: skip
            spec = functools.partial(ToolEnvironment, list(tools), malformed="end")
        if (factories is not None or tools) and settings.max_tool_calling_iterations is not None:
            max_turns = settings.max_tool_calling_iterations + 1
        if spec is None:
            refuse_unused_environment_kwargs(settings.environment_kwargs)
            return None
        if factories is None and not tools:  # a game (grpokit.envs.game) is played by the game runner
            make_game = game_factory(spec, settings.environment_kwargs)
            if make_game is not None:
                return cls(_game_runner(make_game, rows, tokenizer, settings))
        if settings.game_opponent != "self":
            raise InputError(f"GRPOConfig.game_opponent={settings.game_opponent!r} given, but the run's "
                             "environment is no game (grpokit.envs.game); drop game_opponent")  # fmt: skip
        runner = EpisodeRunner.for_rows(
            spec,
            tokenizer,
            rows,
            environment_kwargs=settings.environment_kwargs,
            max_turns=max_turns,
            max_tokens=settings.max_tokens,
            max_turn_tokens=settings.max_turn_tokens,
            timeout=settings.timeout,
            on_error=settings.on_error,
            chat_template_kwargs=settings.chat_template_kwargs,
        )
        return cls(runner, factories)

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
        if self.game is not None:  # deals: every seat of a deal's games an episode, role-major
            episode_rows = [row for row, size in zip(rows, sizes) for _ in range(size)]
            episodes = self.game.run(session, rows, sizes, params, prompt_ids=prompt_ids)
            return as_generation_output(episodes), with_episode_columns(episode_rows, episodes), episodes
        if self.factories is not None:  # each episode with its own instance (``start_episodes``)
            episode_rows = self.factories.episode_rows(rows, sizes)
        else:
            episode_rows = [row for row, size in zip(rows, sizes) for _ in range(size)]
        episodes = self.runner.run(session, episode_rows, params)
        return as_generation_output(episodes), with_episode_columns(episode_rows, episodes), episodes


def _game_runner(
    factory: Callable[[], Any], rows: Sequence[dict[str, Any]], tokenizer: Any, settings: EpisodeSettings
) -> GameRunner:
    """The runner of a run's game; chat prompts refused (a game's rules are a plain-text prompt)."""
    from grpokit.data.chat import is_conversational

    if rows and is_conversational(rows[0]["prompt"]):
        raise InputError(
            f"environment {type(factory()).__name__} is a game: its prompts are plain text (the game's "
            "rules, each seat's observations appended); chat-message prompts are not supported for games"
        )
    return GameRunner(
        factory, tokenizer, opponent=settings.game_opponent, illegal_move_reward=settings.illegal_move_reward,
        max_tokens=settings.max_tokens, max_turn_tokens=settings.max_turn_tokens,
    )  # fmt: skip


def sample_groups(
    episodes: EpisodeSampler | None,
    backend: RolloutBackend,
    rows: list[dict[str, Any]],
    prompt_ids: list[list[int]],
    sizes: list[int],
    params: SamplingParams,
    images: PromptImages | None = None,
) -> tuple[GenerationOutput, list[dict[str, Any]], list[Episode] | None]:
    """``sizes[k]`` completions of prompt k (``generate_groups``; ``images``: the prompts' image inputs), or
    with an environment ``sizes[k]`` episodes: (the completions, one row per completion, the episodes or
    None)."""
    if episodes is None:
        generated = generate_groups(backend, prompt_ids, sizes, params, images)
        return generated, [row for row, size in zip(rows, sizes) for _ in range(size)], None
    return episodes.generate(backend, rows, prompt_ids, sizes, params)


def start_episodes(
    episodes: EpisodeSampler | None, rows: list[dict[str, Any]], sizes: list[int]
) -> list[dict[str, Any]]:
    """The rows as the prompts are encoded from them: as they are, or with TRL's ``environment_factory``
    each row's episodes' instances drawn and reset, and its final prompt (``EnvironmentFactories.start``)."""
    if episodes is None or episodes.factories is None:
        return rows
    return episodes.factories.start(rows, sizes)


def template_kwargs(
    episodes: EpisodeSampler | None, kwargs: dict[str, Any] | None, row: dict[str, Any] | None = None
) -> Any:
    """``chat_template_kwargs`` with an environment's tool schemas added (``tools``; the user's win); with
    TRL's ``environment_factory`` those of ``row``'s environment."""
    if episodes is None:
        return kwargs
    if episodes.factories is not None and row is not None:
        extra = episodes.factories.template_kwargs(row)
    else:
        extra = episodes.runner.template_kwargs
    return {**extra, **(kwargs or {})} if extra else kwargs
