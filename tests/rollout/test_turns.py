"""Multi-turn episodes: the cached session equals re-prefilling, log-probs of policy tokens equal a full
forward over the episode, observation tokens are masked, limits and failures behave as documented."""

from __future__ import annotations

import time

import pytest
import torch

from grpokit.envs import Turn, make_environment_factory
from grpokit.envs.episodes import EnvironmentFailure, EpisodeRunner, as_generation_output, episode_metrics
from grpokit.envs.turns import CachedTurnSession, ReprefillSession
from grpokit.models.tiny import build_char_tokenizer, build_tiny_model
from grpokit.rollout import SamplingParams
from grpokit.rollout.fast import FastSampler


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request, tokenizer):
    model = build_tiny_model(tokenizer, arch=request.param, hidden_size=32, num_layers=2, num_heads=4, seed=3)
    return model.eval()


def echo_env(row, actions):
    """Answers each action with a row-dependent number of characters; ends after 3 turns."""
    if len(actions) == 3:
        return Turn(reward=float(len(actions[-1])), done=True)
    return Turn(observation="ob" * (1 + row["k"] % 3) + "\n", reward=0.5)


def params(tokenizer, greedy: bool, max_new: int = 64) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=max_new, do_sample=not greedy, eos_token_ids=(tokenizer.eos_token_id,),
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip


def run(session, tokenizer, rows, sampling, **limits):
    runner = EpisodeRunner(
        make_environment_factory(echo_env), tokenizer, max_turns=limits.get("max_turns", 4),
        max_tokens=limits.get("max_tokens", 64), max_turn_tokens=limits.get("max_turn_tokens", 5),
    )  # fmt: skip
    return runner.run(session, rows, sampling)


PROMPTS = ["12+7=", "hello there, ", "x"]
SIZES = [2, 3, 1]


def episode_rows():
    return [{"prompt": p, "k": k} for p, size in zip(PROMPTS, SIZES) for k in range(size)]


def prompt_ids(tokenizer):
    return [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]


def full_forward_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """log p(completion[t] | prompt + completion[:t]) for every t, from one plain forward."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # [T, V]
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)


def test_cached_session_equals_reprefilling_and_a_full_forward(model, tokenizer):
    ids = prompt_ids(tokenizer)
    greedy = params(tokenizer, greedy=True)
    cached = run(CachedTurnSession(model, ids, SIZES), tokenizer, episode_rows(), greedy)
    again = run(ReprefillSession(FastSampler(model), ids, SIZES), tokenizer, episode_rows(), greedy)
    assert [e.completion_ids for e in cached] == [e.completion_ids for e in again]
    assert [e.policy_mask for e in cached] == [e.policy_mask for e in again]
    prompts = [p for p, size in zip(ids, SIZES) for _ in range(size)]
    for prompt, episode, other in zip(prompts, cached, again):
        assert len(episode.actions) == 3 and episode.done  # 3 turns of 5 tokens, two observations
        mask = torch.tensor(episode.policy_mask, dtype=torch.bool)
        expected = full_forward_logprobs(model, prompt, episode.completion_ids)[mask]
        torch.testing.assert_close(torch.tensor(episode.logprobs)[mask], expected, atol=2e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(other.logprobs)[mask], expected, atol=2e-5, rtol=0)
        assert all(lp == 0.0 for lp, m in zip(episode.logprobs, episode.policy_mask) if not m)


def test_sampled_episodes_report_the_full_forward_logprob_of_each_policy_token(model, tokenizer):
    ids = prompt_ids(tokenizer)
    session = CachedTurnSession(model, ids, SIZES, generator=torch.Generator().manual_seed(0))
    episodes = run(session, tokenizer, episode_rows(), params(tokenizer, greedy=False))
    prompts = [p for p, size in zip(ids, SIZES) for _ in range(size)]
    for prompt, episode in zip(prompts, episodes):
        mask = torch.tensor(episode.policy_mask, dtype=torch.bool)
        expected = full_forward_logprobs(model, prompt, episode.completion_ids)[mask]
        torch.testing.assert_close(torch.tensor(episode.logprobs)[mask], expected, atol=2e-5, rtol=0)


def test_observations_are_the_environment_text_and_masked(model, tokenizer):
    episodes = run(CachedTurnSession(model, prompt_ids(tokenizer), SIZES), tokenizer, episode_rows(),
                   params(tokenizer, greedy=True))  # fmt: skip
    rows = episode_rows()
    for row, episode in zip(rows, episodes):
        env_tokens = [t for t, m in zip(episode.completion_ids, episode.policy_mask) if not m]
        assert tokenizer.decode(env_tokens) == ("ob" * (1 + row["k"] % 3) + "\n") * 2
        assert episode.turn_rewards == [0.5, 0.5, 5.0] and episode.reward == 6.0
        assert episode.turn_ends == [4, 4 + 5 + len(env_tokens) // 2, len(episode.completion_ids) - 1]
    output = as_generation_output(episodes)
    assert output.policy_mask == [e.policy_mask for e in episodes] and output.truncated == [False] * 6
    assert episode_metrics(episodes)["env/turns"] == 3.0


def test_turn_and_token_limits_truncate(model, tokenizer):
    greedy = params(tokenizer, greedy=True)
    ids = prompt_ids(tokenizer)
    by_turns = run(CachedTurnSession(model, ids, SIZES), tokenizer, episode_rows(), greedy, max_turns=2)
    assert all(e.truncated and not e.done and len(e.actions) == 2 for e in by_turns)
    by_tokens = run(CachedTurnSession(model, ids, SIZES), tokenizer, episode_rows(), greedy, max_tokens=12)
    for episode in by_tokens:
        assert episode.truncated and len(episode.completion_ids) <= 12


def test_an_environment_that_raises_or_hangs_is_bounded(model, tokenizer):
    def flaky(row, actions):
        if row["k"] == 1:
            raise KeyError("boom")
        if row["k"] == 2:
            time.sleep(120)  # far beyond the 0.3 s limit (abandoned on a daemon thread)
        return Turn(reward=1.0, done=True)

    ids, greedy = prompt_ids(tokenizer), params(tokenizer, greedy=True)

    def runner(on_error):
        return EpisodeRunner(make_environment_factory(flaky), tokenizer, max_turns=2, max_tokens=16,
                             max_turn_tokens=3, timeout=0.3, on_error=on_error)  # fmt: skip

    start = time.monotonic()
    episodes = runner("none").run(CachedTurnSession(model, ids, SIZES), episode_rows(), greedy)
    assert time.monotonic() - start < 60  # bounded by the 0.3 s limit, not the 120 s call
    assert [e.reward for e in episodes] == [1.0, None, 1.0, None, None, 1.0]
    assert "KeyError" in episodes[1].failure and "EnvironmentTimeout" in episodes[4].failure
    assert episode_metrics(episodes)["env/failures"] == 3.0
    with pytest.raises(EnvironmentFailure, match="episode 1 at turn 1: KeyError"):
        runner("raise").run(CachedTurnSession(model, ids, SIZES), episode_rows(), greedy)
