"""Evaluation over multi-turn episodes: solve rate as accuracy, pass@k / mean@k over episodes, the episode
means; through a user's RolloutBackend whose turns are known, so every number is checked by hand."""

from __future__ import annotations

import pytest

from grpokit.envs import Turn
from grpokit.envs.episodes import EpisodeRunner
from grpokit.eval import evaluate_model
from grpokit.models.tiny import build_char_tokenizer, build_tiny_model
from grpokit.rollout import GenerationOutput


class QuizBackend:
    """A RolloutBackend that answers "go" to a fresh prompt and, once asked "?", alternates the right digit
    (even rows of a call) and a wrong one (odd rows)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompt_ids, num_generations, params):
        out = []
        for i, ids in enumerate(prompt_ids):
            text = self.tokenizer.decode(ids)
            digit = text.split("=")[1][0]
            reply = "go" if "?" not in text else (digit if i % 2 == 0 else "x")
            out += [self.tokenizer(reply, add_special_tokens=False)["input_ids"] + [params.eos_token_ids[0]]]
        return GenerationOutput(out, [[0.0] * len(ids) for ids in out], [False] * len(out))


def quiz(row, actions):
    if len(actions) == 1:
        return Turn(observation="?\n", reward=0.0, info={"asks": 1})
    return Turn(reward=float(actions[-1] == row["prompt"].split("=")[1][0]), done=True)


@pytest.fixture(scope="module")
def setup():
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=4)
    rows = [{"prompt": f"n={d}:"} for d in "3718"]
    runner = EpisodeRunner.for_rows(quiz, tokenizer, rows, max_turns=4, max_tokens=32)
    return model, tokenizer, rows, runner


def test_solve_rate_and_pass_at_k_over_episodes(setup):
    model, tokenizer, rows, runner = setup
    backend = QuizBackend(tokenizer)
    result = evaluate_model(
        model, tokenizer, rows, num_samples=2, temperature=1.0, max_new_tokens=32,
        generation_backend=backend, episodes=runner, per_example=True,
    )  # fmt: skip
    # every prompt: one solved episode (even row) and one failed (odd row)
    assert result["accuracy"] == 0.5 and result["pass@2"] == 1.0 and result["mean@2"] == 0.5
    assert result["env/turns"] == 2.0 and result["env/done"] == 1.0 and result["env/asks"] == 1.0
    record = result["records"][0]
    assert record["completions"] == ["go?\n3", "go?\nx"]  # the transcripts: actions and observations


def test_greedy_solve_rate(setup):
    model, tokenizer, rows, runner = setup
    backend = QuizBackend(tokenizer)
    result = evaluate_model(
        model,
        tokenizer,
        rows,
        max_new_tokens=32,
        generation_backend=backend,
        episodes=runner,
        per_example=True,
    )
    # one episode per prompt, all four in one call: the even rows are answered right
    assert [r["correct"] for r in result["records"]] == [[True], [False], [True], [False]]
    assert result["accuracy"] == 0.5
