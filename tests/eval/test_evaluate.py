"""evaluate_accuracy: left padding, EOS handling and scoring, on a scripted fake and on a real tiny model."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from grpokit.eval import evaluate_accuracy
from grpokit.models import build_char_tokenizer, build_tiny_model
from grpokit.rewards.extract import extract_answer_tag
from grpokit.tasks.arithmetic import arithmetic_exact_answer_reward, make_arithmetic_splits


class ScriptedLM(torch.nn.Module):
    """Answers each prompt with a scripted completion (cycling through ``script[prompt]`` per sample), and
    records what ``generate`` was given."""

    def __init__(self, tokenizer, script):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.tok = tokenizer
        self.script = script
        self.calls = []

    def generate(
        self,
        input_ids,
        attention_mask,
        max_new_tokens,
        num_return_sequences,
        eos_token_id,
        pad_token_id,
        **kw,
    ):
        self.calls.append(
            {"input_ids": input_ids, "attention_mask": attention_mask, "eos": eos_token_id, **kw}
        )
        rows = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            prompt = self.tok.decode([i for i, m in zip(ids, mask) if m])
            for j in range(num_return_sequences):
                text = self.script[prompt][j % len(self.script[prompt])]
                rows.append(ids + self.tok(text)["input_ids"][:max_new_tokens] + [self.tok.eos_token_id])
        width = max(map(len, rows))
        return torch.tensor([r + [pad_token_id] * (width - len(r)) for r in rows])


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def test_greedy_accuracy_and_left_padding(tok):
    rows = [
        {"prompt": "1+2=", "solution": "3"},
        {"prompt": "10+20=", "solution": "30"},
        {"prompt": "5+5=", "solution": "10"},
        {"prompt": "7+1=", "solution": "8"},
    ]
    script = {
        "1+2=": ["1+2=3<answer>3</answer>"],  # right
        "10+20=": ["0+0=0,1+2=3<answer>30</answer>"],  # right
        "5+5=": ["5+5=10<answer>11</answer>"],  # wrong
        "7+1=": ["no answer here"],  # no answer
    }
    model = ScriptedLM(tok, script)
    model.train()
    out = evaluate_accuracy(
        model, tok, rows, batch_size=2, return_completions=True, extract_fn=extract_answer_tag
    )
    assert out["accuracy"] == pytest.approx(2 / 4)
    assert out["num_examples"] == 4 and out["format_rate"] == pytest.approx(3 / 4)
    assert out["truncated_rate"] == 0.0
    assert [c["correct"] for c in out["completions"]] == [[True], [True], [False], [False]]
    assert out["completions"][0]["completions"] == ["1+2=3<answer>3</answer>"]  # EOS stripped
    assert model.training  # mode restored
    first = model.calls[0]  # batch of "1+2=" and "10+20=": the shorter prompt is padded on the left
    assert first["attention_mask"].tolist()[0] == [0, 0, 1, 1, 1, 1]
    assert first["input_ids"][0, :2].tolist() == [tok.pad_token_id] * 2
    assert first["do_sample"] is False and tok.eos_token_id in first["eos"]


def test_sampling_metrics_and_reward_fn(tok):
    rows = [{"prompt": "1+2=", "solution": "3"}, {"prompt": "2+2=", "solution": "4"}]
    script = {
        # prompt 1: samples right, wrong, wrong, wrong -> c=1 of n=4; majority vote "5" (wrong)
        "1+2=": ["<answer>3</answer>", "<answer>5</answer>", "<answer>5</answer>", "<answer>6</answer>"],
        # prompt 2: right, right, wrong, right -> c=3 of 4; majority "4" (right)
        "2+2=": ["<answer>4</answer>", "<answer>4</answer>", "x", "<answer>4</answer>"],
    }
    out = evaluate_accuracy(
        ScriptedLM(tok, script), tok, rows, num_samples=4, temperature=1.0, extract_fn=extract_answer_tag
    )
    assert out["mean@4"] == pytest.approx((1 / 4 + 3 / 4) / 2)
    assert out["accuracy"] == pytest.approx(out["mean@4"])
    assert out["pass@4"] == pytest.approx(1.0)
    assert out["maj@4"] == pytest.approx(1 / 2)
    # the same through a TRL-signature reward function, on conversational prompts
    chat_rows = [
        {"prompt": [{"role": "user", "content": r["prompt"]}], "solution": r["solution"]} for r in rows
    ]
    by_reward = evaluate_accuracy(
        ScriptedLM(tok, script),
        tok,
        chat_rows,
        num_samples=4,
        temperature=1.0,
        reward_fn=arithmetic_exact_answer_reward,
    )
    assert by_reward["mean@4"] == pytest.approx(out["mean@4"])
    assert by_reward["pass@4"] == pytest.approx(out["pass@4"])
    # without an answer extractor there is nothing to vote on or to call a format
    assert "maj@4" not in by_reward and "format_rate" not in by_reward
    with pytest.raises(ValueError, match="greedy"):
        evaluate_accuracy(
            ScriptedLM(tok, script), tok, rows, num_samples=4, temperature=0.0, extract_fn=extract_answer_tag
        )
    with pytest.raises(ValueError, match="reward_fn or an extract_fn"):
        evaluate_accuracy(ScriptedLM(tok, script), tok, rows)


def test_evaluation_knows_no_task():
    """grpokit.eval grades with what it is given: importing it loads no built-in task."""
    code = "import sys, grpokit.eval; print(any(m.startswith('grpokit.tasks') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_real_tiny_model_returns_fractions(tok):
    _, test = make_arithmetic_splits(seed=0, num_train=1, num_test=6, num_digits=2)
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, num_heads=2)
    grade = {"extract_fn": extract_answer_tag}
    greedy = evaluate_accuracy(model, tok, test, batch_size=4, max_new_tokens=6, **grade)
    assert 0.0 <= greedy["accuracy"] <= 1.0 and greedy["num_examples"] == 6
    assert greedy["mean_completion_tokens"] <= 6
    sampled = evaluate_accuracy(
        model, tok, test, batch_size=8, max_new_tokens=6, num_samples=3, temperature=1.0, seed=5, **grade
    )
    again = evaluate_accuracy(
        model, tok, test, batch_size=8, max_new_tokens=6, num_samples=3, temperature=1.0, seed=5, **grade
    )
    assert sampled == again  # seeded sampling is reproducible
    for key in ("pass@3", "maj@3", "mean@3"):
        assert 0.0 <= sampled[key] <= 1.0
    # conversational prompts render to the same ids, so greedy results are identical
    chat = [{**r, "prompt": [{"role": "user", "content": r["prompt"]}]} for r in test]
    chat_greedy = evaluate_accuracy(
        model, tok, chat, batch_size=4, max_new_tokens=6, return_completions=True, **grade
    )
    plain_greedy = evaluate_accuracy(
        model, tok, test, batch_size=4, max_new_tokens=6, return_completions=True, **grade
    )
    assert [c["completions"] for c in chat_greedy["completions"]] == [
        c["completions"] for c in plain_greedy["completions"]
    ]
