"""The policy verifier (grpokit.models.verifier): its features against a plain computation from the policy's
logits, reading each row where it ends whatever the padding, a transformers checkpoint both ways, the policy
kept frozen through training and iterative updates, and train-rm building it by default on a policy."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

from grpokit.cli.train_rm_command import train_rm_main
from grpokit.core import pad_right
from grpokit.models.tiny import build_tiny_model
from grpokit.models.verifier import (
    FEATURE_SCALE,
    is_policy_verifier,
    token_prediction_features,
)
from grpokit.rm import (
    IterativeRewardModel,
    freeze_bottom,
    load_reward_model,
    outcome_scores,
    save_reward_model,
    train_reward_model,
)


@pytest.fixture
def policy_dir(tmp_path, char_tok):
    policy = build_tiny_model(char_tok, hidden_size=16, num_layers=1, num_heads=2, seed=0)
    policy.save_pretrained(tmp_path / "policy")
    char_tok.save_pretrained(tmp_path / "policy")
    return tmp_path / "policy"


def test_features_by_hand():
    """Position t: log p(x_t) under the distribution predicted at t - 1, its gap to the most likely token,
    and that distribution's entropy, computed here one position at a time from probabilities."""
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 5)  # [B, L, V]
    ids = torch.tensor([[1, 3, 0, 4], [2, 2, 1, 0]])
    features = token_prediction_features(logits, ids)  # [B, L, 3]
    assert features.shape == (2, 4, 3) and torch.equal(features[:, 0], torch.zeros(2, 3))
    for b in range(2):
        for t in range(1, 4):
            probs = torch.softmax(logits[b, t - 1].double(), -1)
            token = torch.log(probs[ids[b, t]])
            entropy = -sum(float(p) * torch.log(p) for p in probs)
            expected = torch.stack([token, token - torch.log(probs.max()), entropy]) / FEATURE_SCALE
            assert torch.allclose(features[b, t].double(), expected, atol=1e-6)
    # the policy's top choice has gap 0
    chosen = ids.clone()
    chosen[0, 1] = logits[0, 0].argmax()
    assert token_prediction_features(logits, chosen)[0, 1, 1] == 0


def test_verifier_reads_the_policy_and_each_row_where_it_ends(policy_dir, char_tok, tmp_path):
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(policy_dir)
    torch.manual_seed(0)
    model, tokenizer = load_reward_model(str(policy_dir), "outcome", extra_layers=1, policy_features=True)
    assert is_policy_verifier(model) and model.config.freeze_policy
    own = policy.state_dict()
    assert all(torch.equal(p, own[n]) for n, p in model.policy.state_dict().items())  # the policy, copied
    assert not any(p.requires_grad for p in model.policy.parameters())
    # outcome score of a row = its last token's logit, scored alone or in a right-padded batch
    prompts = ["1 +2\n"] * 3
    completions = ["1+2=3\n<answer>3</answer>", "x", "<answer>4</answer>"]
    batched = outcome_scores(model, tokenizer, prompts, completions, batch_size=3, output="logit")
    alone = outcome_scores(model, tokenizer, prompts, completions, batch_size=1, output="logit")
    assert batched == pytest.approx(alone, abs=1e-5) and len(set(batched)) == 3
    process = AutoModelForTokenClassification.from_config(model.config)
    process.load_state_dict(model.state_dict())
    ids = [tokenizer(p + c, add_special_tokens=False)["input_ids"] for p, c in zip(prompts, completions)]
    input_ids, mask = pad_right(ids, model.config.pad_token_id)
    with torch.no_grad():
        per_token = process(input_ids=input_ids, attention_mask=mask).logits[..., 0]  # [B, L]
        ends = per_token[torch.arange(3), mask.sum(-1) - 1]
    assert ends.tolist() == pytest.approx(batched, abs=1e-5)
    # a transformers checkpoint: loaded by the Auto class, same scores; as a process model from it
    out = save_reward_model(model, tokenizer, tmp_path / "orm", kind="outcome")
    loaded = AutoModelForSequenceClassification.from_pretrained(out)
    assert outcome_scores(loaded, tokenizer, prompts, completions, output="logit") == pytest.approx(batched)
    as_process, _ = load_reward_model(str(out), "process")
    assert is_policy_verifier(as_process) and as_process.config.num_labels == 1


def test_policy_stays_frozen_in_training_and_iterative_updates(policy_dir, char_tok, tmp_path):
    torch.manual_seed(0)
    model, tokenizer = load_reward_model(str(policy_dir), "process", extra_layers=1, policy_features=True)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    right, wrong = "1+2=3\n<answer>3</answer>", "1+2=4\n<answer>4</answer>"
    samples = [{"prompt": "1 +2\n", "completion": c, "step_labels": [label] * 2}
               for c, label in ((right, 1.0), (wrong, 0.0))] * 4  # fmt: skip
    train_reward_model(model, tokenizer, samples, kind="process", lr=1e-2, batch_size=4)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(n.startswith(("judge.", "features.", "score.")) for n in changed)
    assert any(n.startswith("features.") for n in changed)
    out = save_reward_model(model, tokenizer, tmp_path / "prm", kind="process")
    rm = IterativeRewardModel.from_pretrained(out)
    assert not any(p.requires_grad for p in rm.model.policy.parameters())
    assert all(p.requires_grad for p in rm.model.judge.parameters())
    optimized = sum(len(g["params"]) for g in rm.optimizer.param_groups)
    assert optimized == sum(1 for p in rm.model.parameters() if p.requires_grad)
    model.config.freeze_policy = False  # the whole verifier trains
    freeze_bottom(model, 0)
    assert all(p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match="a policy verifier freezes its whole policy"):
        freeze_bottom(model, 1)


def test_bad_verifier_inputs(policy_dir, tmp_path, capsys):
    with pytest.raises(ValueError, match="the verifier needs extra_layers >= 1"):
        load_reward_model(str(policy_dir), "process", extra_layers=0, policy_features=True)
    model, tokenizer = load_reward_model(str(policy_dir), "process", extra_layers=1, policy_features=True)
    out = save_reward_model(model, tokenizer, tmp_path / "prm", kind="process")
    with pytest.raises(ValueError, match="is not a causal LM"):
        load_reward_model(str(out), "outcome", extra_layers=1, policy_features=True)
    argv = ["--model", "tiny", "--policy_features", "True", "--output_dir", str(tmp_path / "x")]
    assert train_rm_main(argv) == 2
    assert "a policy verifier is built on a causal LM" in capsys.readouterr().err
    argv = ["--model", str(policy_dir), "--extra_layers", "0", "--policy_features", "True",
            "--output_dir", str(tmp_path / "x")]  # fmt: skip
    assert train_rm_main(argv) == 2
    assert "the verifier needs extra_layers >= 1" in capsys.readouterr().err


def test_train_rm_builds_a_verifier_on_a_policy_by_default(policy_dir, tmp_path):
    """train-rm's defaults on a policy: a verifier with 2 new layers, 3 epochs at 1e-3; from that reward
    model an outcome one fine-tunes 1 epoch at 1e-4 and stays a verifier."""
    data = tmp_path / "d.jsonl"
    right, wrong = "1+2=3\n<answer>3</answer>", "1+2=4\n<answer>4</answer>"
    rows = [{"prompt": "1 +2\n", "completion": c, "step_labels": [label] * 2}
            for c, label in ((right, 1.0), (wrong, 0.0))]  # fmt: skip
    data.write_text("\n".join(json.dumps(r) for r in rows))
    argv = ["--kind", "process", "--dataset", str(data), "--model", str(policy_dir),
            "--dense_labels", "False", "--output_dir", str(tmp_path / "prm")]  # fmt: skip
    assert train_rm_main(argv) == 0
    args = json.loads((tmp_path / "prm" / "metrics.json").read_text())["args"]
    keys = ("policy_features", "extra_layers", "freeze_backbone", "epochs", "lr")
    assert [args[k] for k in keys] == [True, 2, True, 3, 1e-3]
    prm = AutoModelForTokenClassification.from_pretrained(tmp_path / "prm")
    assert is_policy_verifier(prm) and prm.config.extra_layers == 2
    outcome = [{"prompt": r["prompt"], "completion": r["completion"], "label": r["step_labels"][-1]}
               for r in rows]  # fmt: skip
    data.write_text("\n".join(json.dumps(r) for r in outcome))
    argv = ["--kind", "outcome", "--dataset", str(data), "--model", str(tmp_path / "prm"),
            "--output_dir", str(tmp_path / "orm")]  # fmt: skip
    assert train_rm_main(argv) == 0
    args = json.loads((tmp_path / "orm" / "metrics.json").read_text())["args"]
    assert [args[k] for k in keys] == [False, 0, True, 1, 1e-4]  # a reward model already: fine-tuned
    orm = AutoModelForSequenceClassification.from_pretrained(tmp_path / "orm")
    assert is_policy_verifier(orm) and orm.config.freeze_policy
