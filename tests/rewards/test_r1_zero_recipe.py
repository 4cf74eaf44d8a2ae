"""The shipped R1-Zero recipe: its reward list resolves to the library's accuracy + format rewards and scores
R1-Zero-style completions as the paper's rule-based reward would (issue #4, item 7)."""

from __future__ import annotations

import pytest
import torch

from grpokit.cli import parse_train_args
from grpokit.cli.train_command import training_data
from grpokit.rewards import combine_rewards, resolve_reward, score_completions


@pytest.fixture(scope="module")
def r1_zero_rewards(tmp_path_factory):
    rows = tmp_path_factory.mktemp("r1") / "rows.jsonl"
    rows.write_text('{"prompt": "What is 6*7?", "solution": "42"}\n')
    args = parse_train_args(["r1-zero", f"dataset={rows}"])
    _, _, specs, weights = training_data(args)
    return [resolve_reward(spec) for spec in specs], weights


def test_recipe_names_accuracy_and_format(r1_zero_rewards):
    rewards, weights = r1_zero_rewards
    assert [fn.__name__ for fn in rewards] == ["accuracy_reward", "answer_tag_format_reward"]
    assert weights == [1.0, 1.0]


@pytest.mark.parametrize(
    ("completion", "accuracy", "form"),
    [
        ("<think>7*6 is 42</think> <answer>42</answer>", 1.0, 1.0),
        ("<think>7*6 is 42</think>\n<answer>\\frac{84}{2}</answer>", 1.0, 1.0),  # math-verify: same value
        ("<think>7*6 is 41</think><answer>41</answer>", 0.0, 1.0),  # well formed, wrong
        ("<answer>42</answer>", 1.0, 0.0),  # right, but no reasoning block
        ("<think>42</think><answer>42</answer> and more", 1.0, 0.0),  # text after the answer
        ("<think></think><answer>42</answer>", 1.0, 0.0),  # empty reasoning
        ("I think it is 42", 1.0, 0.0),  # auto extraction falls back to the last number
    ],
)
def test_r1_zero_style_completions(r1_zero_rewards, completion, accuracy, form):
    rewards, _ = r1_zero_rewards
    prompt = ["What is 7*6? Think in <think></think>, answer in <answer></answer>."]
    scores = [fn(prompt, [completion], [[]], solution=["42"]) for fn in rewards]
    assert scores == [[accuracy], [form]]


def test_summed_reward_is_the_weighted_sum(r1_zero_rewards):
    rewards, weights = r1_zero_rewards
    completions = ["<think>ok</think><answer>42</answer>", "<think>ok</think><answer>41</answer>"]
    matrix, failures = score_completions(rewards, ["q", "q"], completions, [[], []], {"solution": ["42"] * 2})
    assert combine_rewards(matrix, torch.tensor(weights)).tolist() == [2.0, 1.0]
    assert failures == {"accuracy_reward": 0, "answer_tag_format_reward": 0}
