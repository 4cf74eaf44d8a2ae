"""Reward-model training: validation, held-out accuracy going up on a tiny model, the train-rm CLI."""

from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

from grpokit.cli.train_rm_command import train_rm_main
from grpokit.models.tiny import build_tiny_model
from grpokit.rewards.process_rewards import ProcessRewardModel
from grpokit.rm import (
    IterativeRewardModel,
    build_tiny_reward_model,
    evaluate_reward_model,
    freeze_bottom,
    load_reward_model,
    load_rm_samples,
    outcome_scores,
    save_reward_model,
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
    # the defaults made concrete: a random tiny model gets no extra layers; the chain samples carry their
    # worked solutions, so a process model trains on dense labels
    resolved = ("extra_layers", "freeze_backbone", "dense_labels")
    assert [metrics["args"][k] for k in resolved] == [0, False, True]
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
    # on a policy: a policy verifier (tests/rm/test_policy_verifier.py) with 2 new layers, the policy
    # frozen; one label per sample
    args = json.loads((tmp_path / "orm" / "metrics.json").read_text())["args"]
    assert [args[k] for k in resolved] == [2, True, False] and args["policy_features"] is True
    assert orm.config.extra_layers == 2 and orm.config.freeze_policy
    assert orm.policy.model.embed_tokens.weight.shape == policy.model.embed_tokens.weight.shape
    # without the policy's predictions: the policy's own architecture with 2 more layers, its one frozen
    argv += ["--policy_features", "False"]
    argv[argv.index(str(tmp_path / "orm"))] = str(tmp_path / "orm-layers")
    assert train_rm_main(argv) == 0
    orm = AutoModelForSequenceClassification.from_pretrained(tmp_path / "orm-layers")
    assert orm.config.num_hidden_layers == 3 and orm.config.grpokit_frozen_layers == 1
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


def test_extra_layers_on_a_frozen_policy_backbone(tmp_path, char_tok, capsys):
    """New layers go between the policy's layers and the head; with the bottom frozen only they, the final
    norm and the head train, and a saved model stays so in iterative updates."""
    policy = build_tiny_model(char_tok, hidden_size=16, num_layers=1, num_heads=2, seed=0)
    policy.save_pretrained(tmp_path / "policy")
    char_tok.save_pretrained(tmp_path / "policy")
    torch.manual_seed(0)
    model, tokenizer = load_reward_model(str(tmp_path / "policy"), "process", extra_layers=2)
    assert model.config.num_hidden_layers == 3 and model.config.num_labels == 1
    layer0 = dict(policy.model.layers[0].named_parameters())
    assert all(torch.equal(p, layer0[n]) for n, p in model.model.layers[0].named_parameters())
    freeze_bottom(model, 1)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    bottom = ("model.embed", "model.layers.0.")
    assert frozen == {n for n, _ in model.named_parameters() if n.startswith(bottom)}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    samples = digit_samples(16, 0, "process")
    train_reward_model(model, tokenizer, samples, kind="process", lr=1e-2, batch_size=8)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and not changed & frozen and any(n.startswith("model.layers.2.") for n in changed)
    out = save_reward_model(model, tokenizer, tmp_path / "prm", kind="process")
    rm = IterativeRewardModel.from_pretrained(out)
    assert rm.model.config.grpokit_frozen_layers == 1
    assert {n for n, p in rm.model.named_parameters() if not p.requires_grad} == frozen
    optimized = sum(len(g["params"]) for g in rm.optimizer.param_groups)
    assert optimized == sum(1 for p in rm.model.parameters() if p.requires_grad)
    # bad inputs, each naming what is wrong
    with pytest.raises(ValueError, match="extra_layers must be >= 0, got -1"):
        load_reward_model(str(tmp_path / "policy"), "process", extra_layers=-1)
    with pytest.raises(ValueError, match=r"extra_layers: .* is already a process reward model"):
        load_reward_model(str(out), "process", extra_layers=1)
    with pytest.raises(ValueError, match="can freeze 0 to 3 layers of this model, got 4"):
        freeze_bottom(model, 4)
    argv = ["--model", "tiny", "--extra_layers", "1", "--output_dir", str(tmp_path / "x")]
    assert train_rm_main(argv) == 2
    assert "extra_layers and freeze_backbone apply to a starting checkpoint" in capsys.readouterr().err
    argv = ["--model", str(tmp_path / "policy"), "--extra_layers", "-1", "--output_dir", str(tmp_path / "x")]
    assert train_rm_main(argv) == 2
    assert "extra_layers must be >= 0, got -1" in capsys.readouterr().err


def test_trained_reward_model_is_cached(tmp_path, char_tok, monkeypatch):
    """``train-rm:<kind>``: trained once into the cache, then the same directory without training again."""
    from grpokit.cli import train_rm_command
    from grpokit.cli.train_rm_command import resolve_trained_rm, trained_reward_model

    policy = build_tiny_model(char_tok, hidden_size=16, num_layers=1, num_heads=2, seed=0)
    policy.save_pretrained(tmp_path / "policy")
    char_tok.save_pretrained(tmp_path / "policy")
    small = dict(model=str(tmp_path / "policy"), sample_policy=str(tmp_path / "policy"), num_samples=8,
                 num_eval_samples=4, num_generations=4, epochs=1)  # fmt: skip
    path = trained_reward_model("outcome", cache_dir=tmp_path / "cache", **small)
    assert path.parent == tmp_path / "cache" and path.name.startswith("rm-outcome-")
    metrics = json.loads((path / "metrics.json").read_text())
    assert metrics["args"]["num_samples"] == 8 and metrics["train"]["num_samples"] == 8  # 2 questions x 4
    assert AutoModelForSequenceClassification.from_pretrained(path).config.grpokit_reward_kind == "outcome"
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [path.name]  # no temporary directory left

    def no_training(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(train_rm_command, "run_train_rm", no_training)
    assert trained_reward_model("outcome", cache_dir=tmp_path / "cache", **small) == path
    with pytest.raises(AssertionError, match="trained again"):  # other settings: another model
        trained_reward_model("outcome", cache_dir=tmp_path / "cache", **{**small, "epochs": 2})
    with pytest.raises(TypeError, match=r"unknown or fixed settings \['output_dir'\]"):
        trained_reward_model("outcome", cache_dir=tmp_path / "cache", output_dir="x")
    with pytest.raises(ValueError, match=r"'train-rm:bogus': the kind after 'train-rm:' must be"):
        resolve_trained_rm("train-rm:bogus")
    assert resolve_trained_rm("runs/orm") == "runs/orm"


def test_prefix_labels_by_hand(char_tok):
    from grpokit.rm import prefix_labels

    reference = "1+2=3\n<answer>3</answer>"
    # tokens 1 + 2 = 4 \n <answer> 4 </answer>: on track until the wrong result "4", off from there on
    assert prefix_labels(char_tok, "1+2=4\n<answer>4</answer>", reference) == [1, 1, 1, 1, 0, 0, 0, 0, 0]
    assert prefix_labels(char_tok, reference, reference) == [1.0] * 9  # the tag is one token
    assert prefix_labels(char_tok, "1+2=3\n<answer>3</answer>\n", reference) == [1.0] * 9 + [0.0]
    assert prefix_labels(char_tok, "", reference) == []


def test_dense_labels_label_every_completion_token(char_tok):
    from grpokit.rm.training import _collate

    sample = {"prompt": "q\n", "completion": "1+2=4", "step_labels": [0.0], "reference": "1+2=3"}
    pad = char_tok.pad_token_id
    batch = _collate(char_tok, [sample], "process", "\n", None, pad, dense=True)
    assert batch.positions.tolist() == [2, 3, 4, 5, 6]  # after the 2 prompt tokens
    assert batch.labels.tolist() == [1, 1, 1, 1, 0]
    cut = _collate(char_tok, [sample], "process", "\n", 4, pad, dense=True)  # 7 tokens cut to the last 4
    assert cut.positions.tolist() == [0, 1, 2, 3] and cut.labels.tolist() == [1, 1, 1, 0]
    steps = _collate(char_tok, [sample], "process", "\n", None, pad)
    assert steps.positions.tolist() == [6] and steps.labels.tolist() == [0]  # one label, at the step's end
    model = build_tiny_reward_model(char_tok, "process", hidden_size=16, num_layers=1, seed=0)
    metrics = train_reward_model(model, char_tok, [sample] * 4, kind="process", dense_labels=True)
    assert metrics["optimizer_steps"] == 1
    with pytest.raises(ValueError, match="dense_labels: row 0 has no 'reference' field"):
        no_reference = {k: v for k, v in sample.items() if k != "reference"}
        train_reward_model(model, char_tok, [no_reference], kind="process", dense_labels=True)
    with pytest.raises(ValueError, match="dense_labels: per-token labels train process reward models"):
        train_reward_model(model, char_tok, [], kind="outcome", dense_labels=True)
    with pytest.raises(ValueError, match="dataset row 0 field 'reference': expected a string"):
        validate_rm_samples([{**sample, "reference": 3}], "process")
