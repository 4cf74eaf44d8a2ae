"""TRL's ``environment_factory`` protocol without a model: tools from public methods, the pool, reset
writing the prompt, routing by the ``environment`` column, the environment-owned reward, and the errors."""

from __future__ import annotations

import asyncio

import pytest

from grpokit.envs.episodes import Episode, episode_metrics
from grpokit.envs.factories import (
    EMPTY_PROMPT,
    INSTANCE_COLUMN,
    EnvironmentFactories,
    FactoryEnvironment,
    environment_owned_reward,
)
from grpokit.envs.tools import format_tool_call


class Counter:
    built = 0

    def __init__(self):
        Counter.built += 1
        self.count = 0

    def reset(self, **row):
        self.count = 0
        self.row = row
        return f"Count from {row.get('start', 0)}."

    def increment(self, step: int) -> int:
        """Increment the counter.

        Args:
            step: Value to add.
        """
        self.count += step
        return self.count

    def _private(self) -> None: ...

    def get_reward(self) -> float:
        return float(self.count)


class Echo:
    def reset(self, **row): ...

    def shout(self, text: str) -> str:
        """Shout.

        Args:
            text: Text to shout.
        """
        return text.upper()


def shared(x: int) -> int:
    """A tool every environment has.

    Args:
        x: A value.
    """
    return x


def test_public_methods_are_tools_and_the_probe_seeds_the_pool():
    factories = EnvironmentFactories({"counter": Counter, "echo": Echo}, tools=[shared])
    assert [t.__name__ for t in factories.env_tools["counter"]] == ["shared", "increment"]
    assert [t.__name__ for t in factories.env_tools["echo"]] == ["shared", "shout"]
    assert [t.__name__ for t in factories.tools] == ["shared", "increment", "shout"]
    assert [len(factories.pool[name]) for name in ("counter", "echo")] == [1, 1]
    assert [f.__name__ for f in factories.reward_funcs] == ["Counter"]  # Echo has no get_reward
    schema = factories.template_kwargs({"environment": "echo"})["tools"]
    assert [s["function"]["name"] for s in schema] == ["shared", "shout"]


def test_start_resets_each_episode_and_writes_the_prompt():
    factories = EnvironmentFactories(Counter)
    Counter.built = 0
    rows = [{"prompt": [{"role": "user", "content": "Hi. "}], "start": 3}, {"prompt": "Go: ", "start": 5}]
    started = factories.start(rows, [2, 3])
    # one probe existed; 5 episodes need 5 instances: 4 more built, the probe reused
    assert Counter.built == 4 and len(factories.pool[None]) == 5
    assert started[0]["prompt"] == [{"role": "user", "content": "Hi. Count from 3."}]
    assert started[1]["prompt"] == "Go: Count from 5."
    assert rows[0]["prompt"] == [{"role": "user", "content": "Hi. "}]  # the data set's row is untouched
    assert factories.environments == started[0][INSTANCE_COLUMN] + started[1][INSTANCE_COLUMN]
    assert len({id(e) for e in factories.environments}) == 5
    assert factories.environments[0].row == rows[0]  # reset(**row): every column, the prompt included
    episode_rows = factories.episode_rows(started, [2, 3])
    assert [r[INSTANCE_COLUMN] for r in episode_rows] == factories.environments
    factories.start(rows[:1], [2])  # the next batch reuses the pool from its start
    assert len(factories.pool[None]) == 5 and factories.environments == factories.pool[None][:2]


def test_routing_drops_the_environment_column_and_refuses_unknown_names():
    seen = []

    class Seen(Echo):
        def reset(self, **row):
            seen.append(row)

    factories = EnvironmentFactories({"a": Seen, "b": Counter})
    started = factories.start([{"environment": "a", "prompt": "x", "k": 1}], [2])
    assert seen == [{"prompt": "x", "k": 1}] * 2 and started[0]["prompt"] == "x"  # None: prompt as is
    with pytest.raises(ValueError, match=r"environment='c'.*not among the environments.*\['a', 'b'\]"):
        factories.start([{"environment": "c", "prompt": "x"}], [1])


def test_a_group_must_share_its_observation():
    class Random:
        calls = 0

        def reset(self, **row):
            Random.calls += 1
            return f"puzzle {Random.calls}"

    factories = EnvironmentFactories(Random)
    with pytest.raises(
        ValueError, match=r"resets of row 0 returned different observations.*share one prompt"
    ):
        factories.start([{"prompt": "p"}], [2])


def test_episode_environment_runs_its_instances_tools():
    factories = EnvironmentFactories(Counter, tools=[shared])
    started = factories.start([{"prompt": "p"}], [1])
    env = factories.make_env()
    assert isinstance(env, FactoryEnvironment) and env.malformed == "end"
    env.reset(factories.episode_rows(started, [1])[0])
    turn = env.step(format_tool_call("increment", {"step": 2}) + format_tool_call("shared", {"x": 7}))
    assert turn.observation == "<tool_response>2</tool_response><tool_response>7</tool_response>"
    assert factories.environments[0].count == 2  # the episode's own instance was called
    turn = env.step(format_tool_call("get_reward", {}))  # not a tool
    assert "unknown tool 'get_reward'" in turn.observation and turn.info["tool_errors"] == 1
    assert env.step('<tool_call>{"arguments": {}}</tool_call>').done  # malformed: no call, the last action
    with pytest.raises(ValueError, match="no 'environments' column"):
        env.reset({"prompt": "p"})


def test_environment_owned_reward_scores_its_class_only():
    reward = environment_owned_reward(Counter)
    a, b = Counter(), Counter()
    a.count, b.count = 2, 5
    assert reward.__name__ == "Counter"
    assert reward(environments=[a, Echo(), b], prompts=["p"] * 3) == [2.0, None, 5.0]

    class Sub(Counter):  # exact type, as TRL: a subclass is not scored by its parent's column
        pass

    assert reward(environments=[Sub()]) == [None]

    class Judge:
        def reset(self, **row): ...

        async def get_reward(self) -> float:
            return 0.25

    judged = environment_owned_reward(Judge)
    assert asyncio.run(judged(environments=[Judge(), a])) == [0.25, None]


def test_two_names_for_one_class_share_one_reward_column():
    factories = EnvironmentFactories({"x": Counter, "y": Counter, "z": Echo})
    assert [f.__name__ for f in factories.reward_funcs] == ["Counter"]


def test_placeholder_rows_need_max_steps_and_one_environment():
    assert EnvironmentFactories(Counter).placeholder_rows(5, 2) == [{"prompt": EMPTY_PROMPT}] * 2
    with pytest.raises(ValueError, match="`max_steps` must be set"):
        EnvironmentFactories(Counter).placeholder_rows(-1, 2)
    with pytest.raises(ValueError, match="requires a `train_dataset`"):
        EnvironmentFactories({"a": Counter, "b": Echo}).placeholder_rows(5, 2)


def test_bad_factories_are_refused_naming_the_field():
    class NoReset:
        def act(self): ...

    with pytest.raises(
        ValueError, match=r"environment_factory\['n'\] built a NoReset without a reset method"
    ):
        EnvironmentFactories({"n": NoReset})
    with pytest.raises(
        TypeError, match=r"environment_factory\['a'\] must be a class or a no-argument callable"
    ):
        EnvironmentFactories({"a": 3})
    with pytest.raises(TypeError, match="environment_factory must be a class"):
        EnvironmentFactories("Counter")
    with pytest.raises(ValueError, match="environment_factory: an empty dict"):
        EnvironmentFactories({})

    def increment(step: int) -> int:
        return step

    with pytest.raises(ValueError, match="two tools are named 'increment'"):
        EnvironmentFactories(Counter, tools=[increment])
    with pytest.raises(TypeError, match="returned list for a plain-text prompt"):

        class Parts(Echo):
            def reset(self, **row):
                return [{"type": "text", "text": "x"}]

        EnvironmentFactories(Parts).start([{"prompt": "p"}], [1])


def test_trl_tool_metrics_from_the_episode_counters():
    """3 episodes: 1 call that worked, 1 call that failed, no call -> TRL's 2/3 calls per episode and 1/2
    of the calls failed."""
    episodes = [Episode(), Episode(), Episode()]
    episodes[0].info.update({"tool_calls": 1, "tool_errors": 0})
    episodes[1].info.update({"tool_calls": 1, "tool_errors": 1})
    episodes[2].info.update({"tool_calls": 0, "tool_errors": 0})
    metrics = episode_metrics(episodes)
    assert metrics["tools/call_frequency"] == pytest.approx(2 / 3) == metrics["env/tool_calls"]
    assert metrics["tools/failure_frequency"] == pytest.approx(1 / 2)
    for episode in episodes:
        episode.info.update({"tool_calls": 0, "tool_errors": 0})
    episodes[0].info["tool_calls"] = 0
    episodes[1].info["tool_calls"] = 0
    assert episode_metrics(episodes)["tools/failure_frequency"] == 0.0  # no call: 0, as TRL
    assert "tools/call_frequency" not in episode_metrics([Episode()])  # no tool counters: no tool metrics


def test_environment_kwargs_are_not_for_a_factory():
    from grpokit.envs.sampler import EpisodeSampler, EpisodeSettings
    from grpokit.models.tiny import build_char_tokenizer

    settings = EpisodeSettings(environment_kwargs={"size": 3})
    with pytest.raises(ValueError, match="environment_kwargs configures grpokit's environments"):
        EpisodeSampler.for_run(
            None, None, [{"prompt": "p"}], build_char_tokenizer(), settings, EnvironmentFactories(Echo)
        )
