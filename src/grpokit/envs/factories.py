"""TRL's ``environment_factory``: environments whose public methods are the policy's tools, run as grpokit
episodes (docs/environments.md, "TRL's environment_factory").

TRL 1.16's protocol, kept here:

- ``environment_factory`` is a class or a no-argument callable building one environment, or a dict
  ``{name: factory}``: then each row's ``environment`` column picks its factory (a name that is not a key
  is a ValueError naming it) and that column is not passed to ``reset``;
- ``reset(**row)`` starts a rollout on the row's columns and returns None or an observation, appended to the
  prompt's last message (to the prompt itself for a plain-text prompt);
- every public method (no leading ``_``; not ``reset``, not ``get_reward``) is a tool of that environment:
  its schema from the docstring and type hints (``envs.tools.tool_schema``), called in the formats
  ``envs.tools`` parses; a method may be ``async``. Tools given as ``tools=`` are added to every
  environment's;
- ``get_reward()`` (optional, may be async) means the environment owns its reward: one reward function per
  class that has it (two names for one class share it), named after the class, weight 1, after
  ``reward_funcs``; it scores the rollouts of exactly that class and gives None (skipped) to the others;
- instances are built once and reset for every rollout: one per factory is built at construction (its
  methods are the tools) and seeds a pool that grows when a batch needs more instances of it;
- without a ``train_dataset`` the environment owns the data: placeholder rows of one empty user message
  (``generation_batch_size // num_generations`` of them), and ``max_steps`` sets the run's length; a dict
  factory needs a data set to route its rows. Rows without a ``prompt`` get the empty user message.

How it runs in grpokit: :meth:`EnvironmentFactories.start`, before the prompts are encoded, draws an
instance for every episode of the batch, resets it on the row and writes the row's final prompt; the
instance travels in the episode's ``environments`` column (so reward functions receive TRL's
``environments`` list, one per completion), and :class:`FactoryEnvironment`, a
:class:`~grpokit.envs.tools.ToolEnvironment`, runs its tools in the episode (TRL's reading of a malformed
call: no call, the episode's last action). One difference: the G episodes of a prompt share one prompt in
grpokit (one prefill, one ``prompt_ids`` per group), so their resets must return the same observation.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpokit.envs.tools import ToolEnvironment, tool_schema, tool_table

__all__ = [
    "EMPTY_PROMPT",
    "INSTANCE_COLUMN",
    "ROUTING_COLUMN",
    "EnvironmentFactories",
    "FactoryEnvironment",
    "environment_owned_reward",
]

ROUTING_COLUMN = "environment"
"""The row column that picks the environment of a dict ``environment_factory``."""
INSTANCE_COLUMN = "environments"
"""The episode row column holding its environment instance (TRL's ``environments`` reward keyword)."""
EMPTY_PROMPT: list[dict[str, str]] = [{"role": "user", "content": ""}]
"""The prompt of a row that has none (TRL's placeholder): ``reset``'s observation fills it."""
_NOT_TOOLS = ("reset", "get_reward")


class EnvironmentFactories:
    """A run's TRL environments: factories by name (None: the single one), their tools, pools and rewards.

    Args:
        environment_factory: a class or no-argument callable, or a dict ``{name: factory}``.
        tools: TRL's ``tools=``: functions every environment exposes besides its own methods.
    """

    def __init__(self, environment_factory: Any, tools: Sequence[Callable[..., Any]] | None = None) -> None:
        self.multi = isinstance(environment_factory, Mapping)
        if self.multi:
            if not environment_factory:
                raise ValueError("environment_factory: an empty dict; give {name: factory} with one at least")
            factories = dict(environment_factory)
        else:
            factories = {None: environment_factory}
        for name, factory in factories.items():
            if not callable(factory):
                where = "environment_factory" if name is None else f"environment_factory[{name!r}]"
                raise TypeError(
                    f"{where} must be a class or a no-argument callable returning an environment, "
                    f"got {factory!r}"
                )
        self.factories: dict[Any, Callable[[], Any]] = factories
        self.standalone = list(tools or [])
        self.env_tools: dict[Any, list[Callable[..., Any]]] = {}
        """TRL's ``_env_tools``: the tools each environment exposes (``tools=`` first, then its methods)."""
        self.pool: dict[Any, list[Any]] = {}
        """TRL's ``_environment_pool``: each environment's instances, reused (reset) batch after batch."""
        self.tools: list[Callable[..., Any]] = list(self.standalone)
        """Every environment's tools (the probe instances' methods), each once."""
        self.reward_funcs: list[Callable[..., Any]] = []
        """One :func:`environment_owned_reward` per class with ``get_reward``, in the order first seen."""
        rewarded: list[type] = []
        for name, factory in factories.items():
            instance = factory()
            methods = _tool_methods(instance, name)
            tool_table(self.standalone + methods)  # names usable and distinct, or a ValueError now
            self.env_tools[name] = self.standalone + methods
            self.pool[name] = [instance]
            self.tools += [method for method in methods if method not in self.tools]
            if callable(getattr(type(instance), "get_reward", None)) and type(instance) not in rewarded:
                rewarded.append(type(instance))
                self.reward_funcs.append(environment_owned_reward(type(instance)))
        self._schemas = {name: [tool_schema(fn) for fn in fns] for name, fns in self.env_tools.items()}
        self.environments: list[Any] | None = None
        """The instances of the latest batch's episodes, in episode order (TRL's ``trainer.environments``)."""
        self._lock = threading.Lock()  # draws ahead (async_generation) and evaluation share the pools

    # ------------------------------------------------------------------ data
    def placeholder_rows(self, max_steps: int, num_rows: int) -> list[dict[str, Any]]:
        """Rows for a run without ``train_dataset`` (the environment owns the data): ``num_rows`` rows of
        :data:`EMPTY_PROMPT`. Refused for a dict factory (nothing to route by) and without ``max_steps``."""
        if self.multi:
            raise ValueError(
                "A `dict` `environment_factory` (multiple environments) requires a `train_dataset` with an "
                "`environment` column to route each example to its environment. Provide a dataset, or pass a "
                "single environment factory."
            )
        if max_steps <= 0:
            raise ValueError(
                "When training without a `train_dataset` (the environment owns the data and returns the "
                "prompt from `reset()`), `max_steps` must be set to a positive value to define the training "
                "length. Set it via `GRPOConfig(max_steps=...)`."
            )
        return [{"prompt": [dict(m) for m in EMPTY_PROMPT]} for _ in range(max(1, num_rows))]

    # ------------------------------------------------------------------ one batch
    def start(self, rows: Sequence[dict[str, Any]], sizes: Sequence[int]) -> list[dict[str, Any]]:
        """Draw and reset the instances of ``sizes[k]`` episodes of each row; the rows with their final
        prompts and their episodes' instances (a list, in :data:`INSTANCE_COLUMN`; ``episode_rows`` hands
        one to each episode). Sets :attr:`environments`."""
        names = [self._name_of(row) for row in rows]
        with self._lock:
            cursor: dict[Any, int] = {}
            groups = []
            for name, size in zip(names, sizes):
                group = []
                for _ in range(size):
                    pool, index = self.pool[name], cursor.get(name, 0)
                    if index == len(pool):
                        pool.append(self.factories[name]())
                    cursor[name] = index + 1
                    group.append(pool[index])
                groups.append(group)
        started = []
        for k, (row, group) in enumerate(zip(rows, groups)):
            kwargs = (
                {key: value for key, value in row.items() if key != ROUTING_COLUMN} if self.multi else row
            )
            observations = [instance.reset(**dict(kwargs)) for instance in group]
            if observations and any(obs != observations[0] for obs in observations[1:]):
                raise ValueError(
                    f"environment_factory: the {len(group)} resets of row {k} returned different "
                    "observations "
                    f"({observations[0]!r} and {next(o for o in observations if o != observations[0])!r}); "
                    "in grpokit the episodes of a group share one prompt, so reset(**row) must return the "
                    "same observation for the same row (keep per-episode randomness in the environment's "
                    "state, or put the varying part in the data set's rows)"
                )
            prompt = _with_observation(row.get("prompt", EMPTY_PROMPT), observations[0] if group else None)
            started.append({**row, "prompt": prompt, INSTANCE_COLUMN: group})
        self.environments = [instance for group in groups for instance in group]
        return started

    def template_kwargs(self, row: dict[str, Any]) -> dict[str, Any]:
        """The chat-template variables of ``row``'s prompt: ``tools``, the schemas of its environment's
        tools (none when it has none)."""
        schemas = self._schemas[self._name_of(row)]
        return {"tools": schemas} if schemas else {}

    def _name_of(self, row: dict[str, Any]) -> Any:
        if not self.multi:
            return None
        name = row.get(ROUTING_COLUMN)
        if name not in self.factories:
            raise ValueError(
                f"Example has `environment={name!r}`, which is not among the environments passed to "
                f"`environment_factory`. Expected one of: {list(self.factories)}."
            )
        return name

    @staticmethod
    def episode_rows(rows: Sequence[dict[str, Any]], sizes: Sequence[int]) -> list[dict[str, Any]]:
        """One row per episode from :meth:`start`'s rows: row k ``sizes[k]`` times, the j-th with the j-th
        instance of its group in :data:`INSTANCE_COLUMN`."""
        return [
            {**row, INSTANCE_COLUMN: row[INSTANCE_COLUMN][j]}
            for row, size in zip(rows, sizes)
            for j in range(size)
        ]

    def make_env(self) -> FactoryEnvironment:
        """A fresh episode environment (its instance comes with the episode's row)."""
        return FactoryEnvironment(self.standalone)


class FactoryEnvironment(ToolEnvironment):
    """One episode with a TRL environment: ``reset(row)`` takes the instance that
    :meth:`EnvironmentFactories.start` drew and reset (the row's :data:`INSTANCE_COLUMN`) and exposes
    ``tools=`` plus its public methods; ``step`` is :class:`~grpokit.envs.tools.ToolEnvironment`'s with
    ``malformed="end"``. The reward is the reward functions' (``get_reward`` among them), not the
    episode's."""

    def __init__(self, standalone: Sequence[Callable[..., Any]] = ()) -> None:
        super().__init__({"_": _before_reset}, malformed="end")
        self.standalone = list(standalone)
        self.tools = {}
        self.instance: Any = None

    def reset(self, row: dict[str, Any]) -> None:
        super().reset({key: value for key, value in row.items() if key != INSTANCE_COLUMN})
        if INSTANCE_COLUMN not in row:
            raise ValueError(
                f"FactoryEnvironment.reset: the row has no {INSTANCE_COLUMN!r} column (its instance)"
            )
        self.instance = row[INSTANCE_COLUMN]
        self.tools = tool_table(self.standalone + _tool_methods(self.instance, None))

    def schemas(self) -> list[dict[str, Any]]:
        """None before ``reset``: each row's tools go into its own prompt (``EnvironmentFactories``)."""
        return []


def _before_reset() -> None:  # (ToolEnvironment wants a tool at construction; reset replaces the table)
    return None


def environment_owned_reward(env_type: type) -> Callable[..., Any]:
    """TRL's reward of an environment that owns it: ``fn(environments, **columns)`` -> ``get_reward()`` of
    each instance of exactly ``env_type``, None for the others; named after the class; async when
    ``get_reward`` is."""
    if inspect.iscoroutinefunction(env_type.get_reward):

        async def reward(environments: Sequence[Any], **columns: Any) -> list[Any]:
            return [await e.get_reward() if type(e) is env_type else None for e in environments]

    else:

        def reward(environments: Sequence[Any], **columns: Any) -> list[Any]:  # type: ignore[misc]
            return [e.get_reward() if type(e) is env_type else None for e in environments]

    reward.__name__ = reward.__qualname__ = env_type.__name__
    reward.__doc__ = (
        f"{env_type.__name__}.get_reward() of each rollout in a {env_type.__name__}; None for others."
    )
    return reward


def _tool_methods(instance: Any, name: Any) -> list[Callable[..., Any]]:
    """The public methods of ``instance``'s class, bound (TRL lists them on the class, so properties are
    not evaluated); ValueError when it has no ``reset``."""
    members = [member for member, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)]
    if "reset" not in members:
        where = "environment_factory" if name is None else f"environment_factory[{name!r}]"
        raise ValueError(
            f"{where} built a {type(instance).__name__} without a reset method: each environment must define "
            "reset(**row) (it starts a rollout on the row's columns and may return the prompt's observation)"
        )
    return [getattr(instance, m) for m in members if m not in _NOT_TOOLS and not m.startswith("_")]


def _with_observation(prompt: Any, observation: Any) -> Any:
    """``prompt`` with ``observation`` appended to its last message's content (TRL: text to text, text to
    content parts as a text part), or to the prompt itself when it is plain text; None leaves it."""
    if observation is None:
        return prompt
    if isinstance(prompt, str):
        if not isinstance(observation, str):
            raise TypeError(
                f"environment reset returned {type(observation).__name__} for a plain-text prompt; "
                "return a str"
            )
        return prompt + observation
    last = prompt[-1]
    content = last["content"]
    if isinstance(observation, list) and isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if isinstance(observation, str) and isinstance(content, list):
        observation = [{"type": "text", "text": observation}]
    return [*prompt[:-1], {**last, "content": content + observation}]
