"""Reward-model training: validation, held-out accuracy going up on a tiny model, the train-rm CLI."""

from __future__ import annotations

import json
import random

import pytest
from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

from grpokit.cli.train_rm_command import train_rm_main
from grpokit.models.tiny import build_tiny_model
from grpokit.rewards.process_rewards import ProcessRewardModel
from grpokit.rm import (
    build_tiny_reward_model,
    evaluate_reward_model,
    load_rm_samples,
    outcome_scores,
    train_reward_model,
    validate_rm_samples,
)


def digit_samples(n: int, seed: int, kind: str) -> list[dict]:
    """Steps "a+b"; a step is good when b < 5. Learnable in a few epochs by a one-layer model, but only if
    each step is read at its own end token (labels differ between the steps of one completion)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        steps = [(rng.randint(0, 9), rng.randint(0, 9)) for _ in range(rng.randint(1, 3))]
        text = "\n".join(f"{a}+{b}" for a, b in steps) + ("\n" if rng.random() < 0.5 else "")
        labels = [float(b < 5) for _, b in steps]
        if kind == "process":
            rows.append({"prompt": "q\n", "completion": text, "step_labels": labels})
        else:
            rows.append({"prompt": "q\n", "completion": text, "label": labels[-1]})
    return rows


@pytest.mark.parametrize("kind", ["process", "outcome"])
def test_training_improves_held_out_accuracy(char_tok, kind):
    train, test = digit_samples(200, 0, kind), digit_samples(100, 1, kind)
    model = build_tiny_reward_model(char_tok, kind, hidden_size=32, num_layers=2, seed=0)
    before = evaluate_reward_model(model, char_tok, test, kind=kind)
    metrics = train_reward_model(
        model, char_tok, train, kind=kind, epochs=4, lr=3e-3, batch_size=16, seed=0, eval_dataset=test
    )
    after = evaluate_reward_model(model, char_tok, test, kind=kind)
    assert metrics["optimizer_steps"] == 4 * 13  # ceil(200 / 16) batches per epoch
    assert after["accuracy"] == metrics["eval_accuracy"]
    assert before["accuracy"] < 0.65  # chance level (labels are balanced)
    assert after["accuracy"] >= 0.85, (before, after)
    assert after["loss"] < before["loss"]


def test_validation_names_row_and_field():
    good = {"prompt": "p", "completion": "a\nb", "step_labels": [1, 0]}
    assert validate_rm_samples([good], "process") == [good]
    cases = [
        ({"prompt": "p", "completion": "a"}, "outcome", r"row 0: missing the 'label' field"),
        ({"prompt": "p", "completion": "a", "label": 2}, "outcome", r"row 0 field 'label'"),
        (
            {"prompt": "p", "completion": "a\nb", "step_labels": [1]},
            "process",
            r"'step_labels': 1 labels .* 2 steps",
        ),
        ({"prompt": "p", "completion": "a", "step_labels": ["x"]}, "process", r"'step_labels'\[0\]"),
        ({"prompt": 3, "completion": "a", "label": 1}, "outcome", r"field 'prompt'"),
    ]
    for row, kind, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            validate_rm_samples([row], kind)
    with pytest.raises(ValueError, match="kind"):
        validate_rm_samples([good], "pairwise")


def test_load_jsonl_and_json(tmp_path):
    rows = [{"prompt": "p", "completion": "a", "label": 1}, {"prompt": "q", "completion": "b", "label": 0.0}]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "d.json").write_text(json.dumps(rows))
    assert load_rm_samples(tmp_path / "d.jsonl", "outcome") == rows
    assert load_rm_samples(str(tmp_path / "d.json"), "outcome") == rows
    (tmp_path / "bad.jsonl").write_text('{"prompt": "p"}\n{oops\n')
    with pytest.raises(ValueError, match="line 2"):
        load_rm_samples(tmp_path / "bad.jsonl", "outcome")


def test_train_rm_cli_saves_a_loadable_checkpoint(tmp_path, char_tok, capsys):
    out = tmp_path / "prm"
    argv = ["--kind", "process", "--model", "tiny", "--dataset", "chain-synthetic", "--num_samples", "32",
            "--num_eval_samples", "8", "--epochs", "1", "--tiny_hidden_size", "16", "--tiny_num_layers", "1",
            "--output_dir", str(out)]  # fmt: skip
    assert train_rm_main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics) == {"args", "eval_before", "train", "eval_after"}
    model = AutoModelForTokenClassification.from_pretrained(out)
    assert model.config.num_labels == 1 and model.config.step_delimiter == "\n"
    prm = ProcessRewardModel(str(out))
    (scores,) = prm(["2 +3 *2\n"], ["2+3=5\n5*2=10\n<answer>10</answer>"])
    assert len(scores) == 3
    # labelled file in, a causal LM (e.g. the policy) as the backbone, outcome model out
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in digit_samples(16, 0, "outcome")))
    policy = build_tiny_model(char_tok, hidden_size=16, num_layers=1, num_heads=2)
    policy.save_pretrained(tmp_path / "policy")
    char_tok.save_pretrained(tmp_path / "policy")
    argv = ["--kind", "outcome", "--dataset", str(data), "--epochs", "1", "--model", str(tmp_path / "policy"),
            "--output_dir", str(tmp_path / "orm")]  # fmt: skip
    assert train_rm_main(argv) == 0
    orm = AutoModelForSequenceClassification.from_pretrained(tmp_path / "orm")
    assert orm.config.num_labels == 1 and orm.config.grpokit_reward_kind == "outcome"
    backbone = orm.model.embed_tokens.weight
    assert backbone.shape == policy.model.embed_tokens.weight.shape
    # dataset "chain": a policy's own samples (here a random tiny policy), labelled by rule; the held-out
    # accuracy printed beside the constant baseline
    policy_dir = str(tmp_path / "policy")
    argv = ["--kind", "outcome", "--model", policy_dir, "--sample_policy", policy_dir,
            "--num_samples", "12", "--num_generations", "4", "--num_eval_samples", "8", "--epochs", "1",
            "--output_dir", str(tmp_path / "orm-policy")]  # fmt: skip
    capsys.readouterr()
    assert train_rm_main(argv) == 0
    printed = capsys.readouterr().out
    metrics = json.loads((tmp_path / "orm-policy" / "metrics.json").read_text())
    after = metrics["eval_after"]
    assert after["count"] == 8 and f"constant baseline {after['constant_accuracy']:.4f}" in printed
    assert metrics["train"]["num_samples"] == 12  # 3 questions x 4 completions
    # errors: exit status 2 and a message naming the problem
    assert (
        train_rm_main(["--dataset", str(tmp_path / "missing.jsonl"), "--output_dir", str(tmp_path / "x")])
        == 2
    )
    assert "missing.jsonl" in capsys.readouterr().err
    for option, value in (("--pairwise_weight", "-1"), ("--num_generations", "0")):
        argv = ["--model", "tiny", option, value, "--output_dir", str(tmp_path / "y")]
        assert train_rm_main(argv) == 2
        assert option[2:] in capsys.readouterr().err


def test_outcome_scores_do_not_depend_on_padding(char_tok):
    model = build_tiny_reward_model(char_tok, "outcome", hidden_size=16, num_layers=1, seed=0)
    prompts = ["1 +2\n"] * 3
    completions = ["1+2=3\n<answer>3</answer>", "x", "<answer>4</answer>"]
    batched = outcome_scores(model, char_tok, prompts, completions, batch_size=3)
    alone = outcome_scores(model, char_tok, prompts, completions, batch_size=1)
    assert batched == pytest.approx(alone, abs=1e-5)
    assert len(set(batched)) == 3  # each row read at its own last token, not at padding
