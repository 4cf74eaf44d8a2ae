"""GRPO over multi-turn episodes: environment tokens are context for every forward but out of the loss and
the KL (checked by hand on a scripted 2-turn episode), per-turn advantages, user environments by import
path, failures under the reward_failure policy, and the chat-template rendering of observations."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.core import PolicyLoss
from grpokit.envs import Turn
from grpokit.envs.episodes import EnvironmentFailure, Episode
from grpokit.envs.observations import ObservationEncoder
from grpokit.models.tiny import build_char_tokenizer, build_tiny_model
from grpokit.train.batch import LogprobPass, pad_samples
from grpokit.train.process_supervision import EpisodeSupervision
from tests.conftest import small_config

ROWS = [{"prompt": "3+4="}, {"prompt": "1+2="}]


def two_turns(row, actions):
    """Turn 1 answers "ok:<n>\\n" (a row-dependent observation); turn 2 ends the episode, reward = len."""
    if len(actions) == 1:
        return Turn(observation=f"ok:{len(row['prompt'])}\n", reward=0.25)
    return Turn(reward=float(len(actions[-1]) % 3), done=True)


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def make_trainer(tmp_path, tokenizer, env=two_turns, **overrides):
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=4, seed=1)
    values = dict(max_completion_length=24, max_turn_tokens=4, beta=0.1, logging_steps=1)
    config = small_config(tmp_path, **{**values, **overrides})
    return GRPOTrainer(model, None, config, train_dataset=ROWS, processing_class=tokenizer, environment=env)


def full_forward_logprobs(model, prompt, completion):
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)


def test_observation_tokens_are_context_but_not_scored(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer)
    samples = trainer.sample(ROWS)
    batch = pad_samples(samples, torch.zeros(8), **trainer._padding())
    logps = LogprobPass.from_config(trainer.args)(trainer.model, batch)  # [n, C]
    for i, episode in enumerate(samples.episodes):
        n, policy = len(episode.completion_ids), torch.tensor(episode.policy_mask)
        assert episode.done and len(episode.actions) == 2
        observation = [t for t, m in zip(episode.completion_ids, episode.policy_mask) if not m]
        assert tokenizer.decode(observation) == f"ok:{len(samples.rows[i]['prompt'])}\n"
        assert batch.completion_mask[i, :n].tolist() == episode.policy_mask  # loss and KL: policy only
        assert batch.context_mask[i, :n].tolist() == [1] * n  # every forward: the whole episode
        prompt = samples.prompt_ids[i // 4]
        expected = full_forward_logprobs(trainer.model, prompt, episode.completion_ids)
        torch.testing.assert_close(logps[i, :n] * policy, expected * policy, atol=1e-5, rtol=0)
    assert samples.rows[0]["env_reward"] == samples.episodes[0].reward  # the column reward functions read


def test_loss_and_kl_by_hand_ignore_environment_tokens(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer)
    samples = trainer.sample(ROWS)
    advantages = torch.tensor([1.0, -1.0, 0.5, 0.0, -0.5, 2.0, 0.0, 1.0])
    batch = pad_samples(samples, advantages, **trainer._padding())
    logps = LogprobPass.from_config(trainer.args)(trainer.model, batch)
    ref = logps - 0.3 * batch.completion_mask  # a reference 0.3 nats below the policy on policy tokens
    env_tokens = (batch.context_mask - batch.completion_mask).bool()
    ref = ref.masked_fill(env_tokens, 7.0)  # nonsense where the environment wrote: must not count
    loss = PolicyLoss(loss_type="grpo", beta=0.1)
    value, _ = loss(logps, None, batch.advantages, batch.completion_mask.float(), ref_logps=ref)
    # GRPO on-policy (ratio 1): mean over episodes of the mean over its POLICY tokens of -A + beta * k3,
    # k3 = exp(ref - logp) - (ref - logp) - 1 with ref - logp = -0.3 on every policy token.
    k3 = torch.exp(torch.tensor(-0.3)) + 0.3 - 1
    hand = sum(-a + 0.1 * k3 for a in advantages.tolist()) / 8
    torch.testing.assert_close(value, hand, atol=1e-6, rtol=0)


def test_turn_advantages_by_hand(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer, turn_advantages=True, num_generations=2,
                           per_device_train_batch_size=4)  # fmt: skip
    (hook,) = [h for h in trainer.hooks.hooks if isinstance(h, EpisodeSupervision)]
    # two episodes of one group: turn rewards [1, 0] and [0, None]; turns end at tokens 1, 4 and 2, 5
    hook._episodes = [Episode(turn_rewards=[1.0, 0.0], turn_ends=[1, 4]), Episode(turn_rewards=[0.0, None],
                      turn_ends=[2, 5])]  # fmt: skip
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 1]])
    batch = type("B", (), {})()
    batch.completion_mask, batch.advantages = mask, torch.tensor([0.0, 0.0])
    hook.on_batch(batch)
    # R = [1, 0, 0, 0]: mean 0.25, unbiased std 0.5 -> normalised [1.5, -0.5 | -0.5, -0.5] (eps 1e-4)
    s = 0.5 + 1e-4
    r = [(1 - 0.25) / s, (0 - 0.25) / s, (0 - 0.25) / s, (0 - 0.25) / s]
    expected = torch.tensor([
        [r[0] + r[1], r[0] + r[1], 0, 0, r[1], 0],
        [r[2] + r[3], r[2] + r[3], r[2] + r[3], 0, 0, r[3]],
    ])  # fmt: skip
    torch.testing.assert_close(batch.advantages, expected, atol=1e-5, rtol=0)


def test_training_steps_log_environment_metrics(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer, max_steps=2)
    history = trainer.train()
    last = history[-1]
    assert last["env/turns"] == 2.0 and last["env/done"] == 1.0 and last["env/failures"] == 0.0
    assert last["rewards/environment_reward/mean"] == pytest.approx(last["env/reward"])


def test_a_user_environment_class_by_import_path(tmp_path, tokenizer, monkeypatch):
    (tmp_path / "my_envs.py").write_text(
        textwrap.dedent('''
        from grpokit.envs import Turn

        class Counter:
            """Ends after `turns` actions; reward 1 when the last action is non-empty."""
            def __init__(self, turns=1):
                self.turns, self.seen = turns, 0
            def reset(self, row):
                self.seen = 0
            def step(self, action):
                self.seen += 1
                if self.seen == self.turns:
                    return Turn(reward=1.0 if action else 0.0, done=True)
                return Turn(observation="more\\n")
    ''')
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    trainer = make_trainer(tmp_path, tokenizer, env=None, environment="my_envs.Counter",
                           environment_kwargs={"turns": 3}, max_steps=1)  # fmt: skip
    samples = trainer.sample(ROWS)
    assert all(len(e.actions) == 3 and e.done for e in samples.episodes)
    sys.modules.pop("my_envs", None)


@pytest.mark.parametrize("policy", ["raise", "none"])
def test_a_failing_environment_follows_reward_failure(tmp_path, tokenizer, policy):
    def broken(row, actions):
        if row["prompt"] == "1+2=":
            raise RuntimeError("lost connection")
        return Turn(reward=1.0, done=True)

    trainer = make_trainer(tmp_path, tokenizer, env=broken, reward_failure=policy)
    if policy == "raise":
        with pytest.raises(EnvironmentFailure, match="episode 4 at turn 1: RuntimeError: lost connection"):
            trainer.sample(ROWS)
        return
    history = trainer.train()
    assert history[-1]["env/failures"] == 4.0  # the second prompt's 4 episodes; the run went on
    assert history[-1]["env/reward"] == 1.0


def test_chat_observations_follow_the_template(tokenizer):
    chat = build_char_tokenizer(tags=("<|im_start|>",))
    chat.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    encoder = ObservationEncoder(chat, chat=True)
    # after the EOS that ends the policy's turn: the rest of the template's line, the tool message, and
    # the next assistant header
    expected = "\n<|im_start|>tool\n42<|endoftext|>\n<|im_start|>assistant\n"
    assert encoder("42", "tool") == chat(expected, add_special_tokens=False)["input_ids"]
    assert ObservationEncoder(chat, chat=False)("42") == chat("42", add_special_tokens=False)["input_ids"]
    assert encoder(None) == [] and encoder("") == []


def test_chat_observations_when_the_last_assistant_turn_renders_differently():
    """Qwen3's template writes an empty think block into the last assistant message only: the earlier
    text differs once a tool message follows, the tokens after the turn's EOS are still the observation."""
    chat = build_char_tokenizer(tags=("<|im_start|>", "<think>", "</think>"))
    chat.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and loop.last %}<think></think>{% endif %}"
        "{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    expected = "\n<|im_start|>tool\n42<|endoftext|>\n<|im_start|>assistant\n"
    assert (
        ObservationEncoder(chat, chat=True)("42", "tool")
        == chat(expected, add_special_tokens=False)["input_ids"]
    )
    chat.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}{{ eos_token }}"  # no EOS per turn
    )
    with pytest.raises(ValueError, match="renders earlier messages differently"):
        ObservationEncoder(chat, chat=True)("42", "tool")


def test_turn_advantages_need_an_environment(tmp_path):
    config = GRPOConfig(output_dir=str(tmp_path), turn_advantages=True)
    with pytest.raises(ValueError, match="turn_advantages needs an environment"):
        EpisodeSupervision.for_run(config, has_environment=False)


def test_a_tool_environment_puts_its_tools_in_the_chat_template(tmp_path, tokenizer):
    from grpokit.envs.tools import ToolEnvironment

    def lookup(word: str) -> str:
        """Look a word up.

        Args:
            word: the word.
        """
        return word.upper()

    chat = build_char_tokenizer()
    chat.chat_template = (
        "{% if tools %}[{% for t in tools %}{{ t['function']['name'] }}{% endfor %}]{% endif %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    model = build_tiny_model(chat, hidden_size=32, num_layers=1, num_heads=4)
    rows = [{"prompt": [{"role": "user", "content": word}]} for word in ("hi", "yo")]
    config = small_config(tmp_path, max_completion_length=12, max_turn_tokens=4, max_turns=2)
    trainer = GRPOTrainer(model, None, config, train_dataset=rows, processing_class=chat,
                          environment=lambda: ToolEnvironment([lookup]))  # fmt: skip
    assert chat.decode(trainer.encode_prompt(rows[0]["prompt"])) == "[lookup]hi"


def test_trl_tools_argument_runs_tool_episodes(tmp_path, tokenizer):
    from grpokit.envs.tools import ToolEnvironment

    def lookup(word: str) -> str:
        """Look a word up.

        Args:
            word: the word.
        """
        return word.upper()

    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=4)
    config = small_config(
        tmp_path, max_completion_length=12, max_turn_tokens=3, max_tool_calling_iterations=2
    )
    trainer = GRPOTrainer(model, None, config, train_dataset=ROWS, processing_class=tokenizer, tools=[lookup])
    runner = trainer.episodes.runner
    assert runner.max_turns == 3 and isinstance(runner.make_env(), ToolEnvironment)
    samples = trainer.sample(ROWS)  # the random policy calls no tool: each episode ends after one turn
    assert all(e.done and len(e.actions) == 1 and e.info["tool_calls"] == 0 for e in samples.episodes)
    with pytest.raises(ValueError, match="give tools= or an environment, not both"):
        GRPOTrainer(model, None, config, train_dataset=ROWS, processing_class=tokenizer, tools=[lookup],
                    environment=two_turns)  # fmt: skip
