"""GRPOTrainer with TRL's ``environment_factory``: a real short run on the tiny policy where the environment
owns the data and the reward (rewards, tool metrics and the instances' states checked by hand), routing
of a dict factory with each prompt rendered with its own environment's tools, and the construction errors."""

from __future__ import annotations

import pytest
import torch

from grpokit import GRPOTrainer
from grpokit.models.tiny import build_char_tokenizer, build_tiny_model
from grpokit.rewards.reward_logs import RewardLogs
from grpokit.rollout.base import GenerationOutput
from tests.conftest import small_config

INCREMENT = '<tool_call>{"name": "increment", "arguments": {"step": 1}}</tool_call>'
DECREMENT = '<tool_call>{"name": "decrement", "arguments": {"step": 2}}</tool_call>'  # no such tool
FIRST_TURNS = [INCREMENT, DECREMENT, "no"]


class Counter:
    """TRL's DummyEnvironment: the policy may call ``increment``; the reward is the final count."""

    def reset(self, **row):
        self.count = 0
        return "Count:"

    def increment(self, step: int) -> int:
        """Increment the counter.

        Args:
            step: Value to add to the counter.
        """
        self.count += step
        return self.count

    def get_reward(self) -> float:
        return float(self.count)


class Turns:
    """A scripted backend (re-prefilled each turn): an episode whose context holds a tool call answers
    "done"; otherwise episode i of the call answers ``script(text, i)``."""

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script = tokenizer, script

    def generate(self, prompt_ids, num_generations, params):
        completions = []
        for i, ids in enumerate(prompt_ids):
            text = self.tokenizer.decode(list(ids), skip_special_tokens=True)
            reply = "done" if "</tool_call>" in text else self.script(text, i)
            completions.append(
                self.tokenizer(reply, add_special_tokens=False)["input_ids"] + [params.eos_token_ids[0]]
            )
        return GenerationOutput(
            completion_ids=completions, logprobs=None, truncated=[False] * len(completions)
        )


def test_environment_owned_data_and_reward_train(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    seen = []

    def keyed(prompts, completions, environments, **columns):
        seen.append(environments)
        return [0.0] * len(completions)

    config = small_config(
        tmp_path, max_steps=2, num_generations=3, per_device_train_batch_size=6, max_completion_length=96,
        logging_steps=1, reward_weights=[0.5], learning_rate=1e-2,
    )  # fmt: skip
    trainer = GRPOTrainer(
        str(tiny_model_dir), keyed, config, environment_factory=Counter,
        rollout_backend=Turns(tokenizer, lambda text, i: FIRST_TURNS[i % 3]),
    )  # fmt: skip
    assert trainer.reward_func_names == ["keyed", "Counter"]
    assert trainer.reward_weights.tolist() == [0.5, 1.0]  # reward_weights weighs reward_funcs only
    assert [t.__name__ for t in trainer.tools] == ["increment"]
    assert len(trainer.train_rows) == 2  # placeholder rows: generation_batch_size / G = 6 / 3
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    last = trainer.state.log_history[-2]  # (the last entry is the run's summary)
    # every group: counts 1 (increment ran), 0 (unknown tool), 0 (no call) -> rewards 1, 0, 0
    assert last["rewards/Counter/mean"] == pytest.approx(1 / 3)
    assert last["reward"] == pytest.approx(1 / 3)  # 0.5 * 0 + 1 * mean(1, 0, 0)
    assert last["tools/call_frequency"] == pytest.approx(2 / 3)  # 4 calls in 6 episodes
    assert last["tools/failure_frequency"] == pytest.approx(1 / 2)  # 2 of the 4 failed
    assert [e.count for e in trainer.environments] == [1, 0, 0, 1, 0, 0]
    assert len(trainer._environment_pool[None]) == 6  # the probe + 5 built, reused at step 2
    assert len(seen) == 2 and all(len(envs) == 6 for envs in seen)
    assert seen[-1] == trainer.environments  # TRL's `environments` keyword: one instance per completion
    assert trainer.state.log_history[-1]["train_loss"] is not None
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


def test_a_dict_factory_routes_rows_and_renders_each_prompts_tools(tmp_path):
    calls = []

    class Echo:
        def reset(self, **row):
            return "Echo."

        def shout(self, text: str) -> str:
            """Shout.

            Args:
                text: Text to shout.
            """
            calls.append(text)
            return text.upper()

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = (
        "{% if tools %}[{% for t in tools %}{{ t['function']['name'] }}{% endfor %}]{% endif %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=4)

    def script(text, i):
        return (
            '<tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>' if "Echo" in text else "x"
        )

    rows = [
        {"environment": "echo"},
        {"environment": "counter", "prompt": [{"role": "user", "content": "Go "}]},
    ]
    config = small_config(
        tmp_path, num_generations=2, per_device_train_batch_size=4, max_completion_length=96
    )
    trainer = GRPOTrainer(
        model, None, config, train_dataset=rows, processing_class=tokenizer,
        environment_factory={"echo": Echo, "counter": Counter}, rollout_backend=Turns(tokenizer, script),
    )  # fmt: skip
    assert trainer.reward_func_names == ["Counter"]  # Echo owns no reward
    samples = trainer.sample(trainer.train_rows)
    prompts = [tokenizer.decode(ids) for ids in samples.prompt_ids]
    assert prompts == ["[shout]Echo.", "[increment]Go Count:"]  # (a row without prompt: reset writes it)
    assert calls == ["hi", "hi"]  # both echo episodes called their own environment's tool
    assert [e.info["tool_calls"] for e in samples.episodes] == [1, 1, 0, 0]
    rewards, _ = trainer.reward_matrix(samples, RewardLogs())
    assert rewards[:, 0].isnan().tolist() == [True, True, False, False]  # Counter scores its own rollouts
    bad = [{"environment": "nowhere", "prompt": "x"}]
    with pytest.raises(ValueError, match="not among the environments"):
        trainer.sample(bad)


def test_construction_errors_name_what_is_missing(tmp_path, tiny_model_dir):
    rows = [{"prompt": "1+1="}]
    config = small_config(tmp_path)
    with pytest.raises(ValueError, match="No reward source provided"):
        GRPOTrainer(str(tiny_model_dir), None, config, train_dataset=rows)
    with pytest.raises(ValueError, match="`train_dataset` is required"):
        GRPOTrainer(str(tiny_model_dir), lambda completions, **kw: [0.0] * len(completions), config)
    with pytest.raises(ValueError, match="`max_steps` must be set"):
        GRPOTrainer(
            str(tiny_model_dir), None, small_config(tmp_path, max_steps=-1), environment_factory=Counter
        )

    class Plain:
        def reset(self, **row): ...

    with pytest.raises(ValueError, match="No reward source provided"):  # no reward_funcs, no get_reward
        GRPOTrainer(str(tiny_model_dir), None, config, environment_factory=Plain)
    with pytest.raises(ValueError, match=r"environment_factory= .*or an environment .*not both"):
        GRPOTrainer(str(tiny_model_dir), None, config, environment_factory=Counter, environment="maze")
    with pytest.raises(ValueError, match="async_generation is not supported here: TRL's environment_factory"):
        async_config = small_config(tmp_path, async_generation=True)
        GRPOTrainer(str(tiny_model_dir), None, async_config, environment_factory=Counter)
