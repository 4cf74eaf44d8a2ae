"""Process supervision and iterative GRPO in GRPOTrainer: per-token advantages reaching the loss, the
reward-model update with replay, and the reference reset, on a tiny policy with scripted completions."""

from __future__ import annotations

import json
import math

import pytest
import torch

import grpokit.rm.iterative as iterative_module
import grpokit.train.update as update_module
from grpokit import GRPOConfig, GRPOTrainer
from grpokit.core import PolicyLoss
from grpokit.models.tiny import build_char_tokenizer
from grpokit.rm import IterativeRewardModel, build_tiny_reward_model
from grpokit.rollout.fake import ScriptedBackend
from grpokit.tasks.chain import (
    chain_outcome_reward,
    chain_step_reward,
    make_chain_rm_samples,
    make_chain_splits,
)

# One prompt: start 2, then +3, then *2 -> 10. G = 4 scripted completions (character tokenizer: one token per
# character, <answer> and </answer> one token each, EOS appended by the backend).
ROW = {"prompt": "2 +3 *2\n", "solution": "10", "start": 2, "operations": ["+3", "*2"]}
COMPLETIONS = [
    "2+3=5\n5*2=10\n<answer>10</answer>",  # steps right, right, right; answer right
    "2+3=5\n5*2=11\n<answer>11</answer>",  # right, wrong, wrong (prefix rule)
    "2+3=6\n6*2=12\n<answer>12</answer>",  # wrong, wrong, wrong
    "2+3=5",  # one step, right; no answer
]


def scripted(tokenizer):
    return ScriptedBackend(tokenizer, lambda prompt, index: COMPLETIONS[index % len(COMPLETIONS)])


def make_config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "run"),
        max_steps=1,
        num_generations=4,
        per_device_train_batch_size=4,  # one prompt x G=4 per step, one micro-batch
        max_completion_length=24,
        learning_rate=1e-3,
        disable_tqdm=True,
        seed=0,
    )
    values.update(overrides)
    return GRPOConfig(**values)


def make_trainer(tiny_model_dir, tmp_path, reward_funcs=(chain_outcome_reward,), **kwargs):
    config = kwargs.pop("config", None) or make_config(tmp_path)
    tokenizer = build_char_tokenizer()
    trainer = GRPOTrainer(
        str(tiny_model_dir),
        list(reward_funcs),
        config,
        train_dataset=[ROW],
        processing_class=tokenizer,
        rollout_backend=scripted(tokenizer),
        **kwargs,
    )
    return trainer


def record_loss_inputs(monkeypatch):
    """Every micro-batch's RolloutBatch and the advantages policy_loss received."""
    calls = []
    original_loss, original_micro = PolicyLoss.__call__, update_module._micro_batch_loss

    def micro(batch, *args, **kwargs):
        calls.append({"batch": batch})
        return original_micro(batch, *args, **kwargs)

    def loss(self, logps, old_logps, advantages, mask, **kwargs):
        calls[-1]["advantages"] = advantages.detach().clone()
        calls[-1]["mask"] = mask.detach().clone()
        return original_loss(self, logps, old_logps, advantages, mask, **kwargs)

    monkeypatch.setattr(update_module, "_micro_batch_loss", micro)
    monkeypatch.setattr(PolicyLoss, "__call__", loss)
    return calls


def expected_advantages(text: str, outcome_weight: float, width: int) -> list[float]:
    """The token advantages of one scripted completion, by hand (DeepSeekMath 4.1.3 + outcome part).

    Step rewards (chain_steps, prefix rule) of the group: [1,1,1], [1,0,0], [0,0,0], [1] -> R has ten values,
    five 1s and five 0s: mean 0.5, unbiased std sqrt(10 * 0.25 / 9) = 0.52705; a right step gets
    +0.5 / (0.52705 + 1e-4), a wrong one the opposite. Outcome rewards [1, 0, 0, 0]: mean 0.25, unbiased
    std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5, so A_outcome = 0.75 / 0.5001 or -0.25 / 0.5001.
    Step ends (one token per character; the newline closing a line ends its step): "2+3=5\\n" ends at token
    5, "5*2=10\\n" at 12, the answer line "<answer>10</answer>" (4 tokens: 13..16) at 16; "2+3=5" alone
    ends at 4. A[t] = outcome_weight * A_outcome + sum of the normalised rewards of steps ending at or
    after t, on the completion's tokens (EOS included, where the process part is 0), 0 on padding.
    """
    right = 0.5 / (math.sqrt(10 * 0.25 / 9) + 1e-4)
    rewards = {
        COMPLETIONS[0]: [right, right, right],
        COMPLETIONS[1]: [right, -right, -right],
        COMPLETIONS[2]: [-right, -right, -right],
        COMPLETIONS[3]: [right],
    }[text]
    ends = [4] if text == COMPLETIONS[3] else [5, 12, 16]
    length = 6 if text == COMPLETIONS[3] else 18  # + EOS
    outcome = (0.75 if text == COMPLETIONS[0] else -0.25) / (0.5 + 1e-4)
    out = []
    for t in range(width):
        if t >= length:
            out.append(0.0)
            continue
        process = sum(r for r, e in zip(rewards, ends) if e >= t)
        out.append(outcome_weight * outcome + process)
    return out


def test_per_token_advantages_reach_the_loss(tiny_model_dir, tmp_path, monkeypatch):
    calls = record_loss_inputs(monkeypatch)
    config = make_config(tmp_path, outcome_advantage_weight=0.5, process_advantage_weight=1.0)
    trainer = make_trainer(tiny_model_dir, tmp_path, config=config, process_reward_funcs=["chain_steps"])
    history = trainer.train()
    assert len(calls) == 1
    advantages, batch = calls[0]["advantages"], calls[0]["batch"]
    assert advantages.shape == batch.completion_ids.shape == (4, 18)  # [n, C]
    assert torch.equal(advantages, batch.advantages)
    texts = trainer.tokenizer.batch_decode(batch.completion_ids, skip_special_tokens=True)
    assert sorted(texts) == sorted(COMPLETIONS)  # rows come shuffled; match them by text
    for row, text in enumerate(texts):
        expected = torch.tensor(expected_advantages(text, 0.5, 18))
        torch.testing.assert_close(advantages[row], expected, atol=1e-5, rtol=1e-5)
    metrics = history[-1]
    assert metrics["process_rewards/chain_steps/mean"] == pytest.approx(5 / 10)
    assert metrics["process_rewards/num_steps/mean"] == pytest.approx(10 / 4)
    assert metrics["process_reward"] == pytest.approx(0.5)
    assert metrics["rewards/chain_outcome_reward/mean"] == pytest.approx(0.25)
    assert math.isfinite(metrics["loss"])


def test_pure_process_supervision_without_outcome_rewards(tiny_model_dir, tmp_path, monkeypatch):
    calls = record_loss_inputs(monkeypatch)
    config = make_config(tmp_path, outcome_advantage_weight=0.0)
    trainer = make_trainer(
        tiny_model_dir, tmp_path, reward_funcs=[], config=config, process_reward_funcs=[chain_step_reward]
    )
    trainer.train()
    advantages, batch = calls[0]["advantages"], calls[0]["batch"]
    texts = trainer.tokenizer.batch_decode(batch.completion_ids, skip_special_tokens=True)
    for row, text in enumerate(texts):
        expected = torch.tensor(expected_advantages(text, 0.0, 18))
        torch.testing.assert_close(advantages[row], expected, atol=1e-5, rtol=1e-5)


def test_outcome_only_keeps_sequence_advantages(tiny_model_dir, tmp_path, monkeypatch):
    calls = record_loss_inputs(monkeypatch)
    make_trainer(tiny_model_dir, tmp_path).train()
    assert calls[0]["advantages"].shape == (4,)


def test_process_configuration_errors(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="process_reward_weights has 2 values"):
        make_trainer(
            tiny_model_dir,
            tmp_path,
            config=make_config(tmp_path, process_reward_weights=[1.0, 1.0]),
            process_reward_funcs=["chain_steps"],
        )
    with pytest.raises(ValueError, match="No reward source provided: reward_funcs needs at least one"):
        make_trainer(tiny_model_dir, tmp_path, reward_funcs=[])
    with pytest.raises(ValueError, match="iteration_steps > 0 needs an iterative_reward_model"):
        make_trainer(tiny_model_dir, tmp_path, config=make_config(tmp_path, iteration_steps=2))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"iteration_steps": 2, "beta": 0.0}, "iteration_steps"),
        ({"iteration_steps": -1}, "iteration_steps"),
        ({"replay_ratio": 1.0}, "replay_ratio"),
        ({"replay_ratio": -0.1}, "replay_ratio"),
        ({"step_delimiter": ""}, "step_delimiter"),
        ({"outcome_advantage_weight": -1.0}, "outcome_advantage_weight"),
        ({"outcome_advantage_weight": 0.0, "process_advantage_weight": 0.0}, "process_advantage_weight"),
        ({"rm_epochs": 0}, "rm_epochs"),
        ({"rm_batch_size": 0}, "rm_batch_size"),
        ({"rm_buffer_capacity": 0}, "rm_buffer_capacity"),
        ({"process_reward_weights": []}, "process_reward_weights"),
    ],
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"GRPOConfig.{field} "):
        GRPOConfig(**kwargs)


# ---------------------------------------------------------------------------------------------------------
# iterative GRPO


def iterative_rm(history_size: int = 40, replay_ratio: float = 0.2):
    tokenizer = build_char_tokenizer()
    train, _ = make_chain_splits(0, history_size, 1, num_ops=2)
    history = make_chain_rm_samples(train, kind="process", seed=0)
    model = build_tiny_reward_model(tokenizer, "process", hidden_size=16, num_layers=1, seed=0)
    return IterativeRewardModel(
        model,
        tokenizer,
        kind="process",
        replay_ratio=replay_ratio,
        lr=1e-2,
        batch_size=8,
        initial_samples=history,
    )


def params_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    other = dict(b.named_parameters())
    return all(torch.equal(p, other[name]) for name, p in a.named_parameters())


def test_iterative_rm_update_replay_and_reference_reset(tiny_model_dir, tmp_path, monkeypatch):
    trained_on = []
    original_train = iterative_module.train_reward_model

    def spy_train(model, tokenizer, dataset, **kwargs):
        trained_on.append(list(dataset))
        return original_train(model, tokenizer, dataset, **kwargs)

    monkeypatch.setattr(iterative_module, "train_reward_model", spy_train)
    rm = iterative_rm(history_size=40, replay_ratio=0.2)
    historical = [json.dumps(s, sort_keys=True) for s in rm.buffer.samples]
    config = make_config(tmp_path, iteration_steps=2, max_steps=4, beta=0.04, outcome_advantage_weight=0.0)
    trainer = make_trainer(
        tiny_model_dir, tmp_path, config=config, iterative_reward_model=rm, rm_label_func="chain_steps"
    )
    # the PRM being trained is the process reward that scores (same module, nothing to swap)
    assert trainer.process.funcs[-1].model is rm.model
    rm_weights = [p.detach().clone() for p in rm.model.parameters()]

    history = []
    for expected_equal in (False, True, False, True):  # steps 1..4: the reference is reset after 2 and 4
        history.append(trainer.training_step())
        trainer.step += 1
        assert params_equal(trainer.reference.model, trainer.unwrapped_model) is expected_equal

    # reward-model updates after steps 2 and 4 only, each on the 2 x G = 8 completions since the last one
    assert ["rm/loss_on_policy" in m for m in history] == [False, True, False, True]
    for metrics in (history[1], history[3]):
        assert metrics["rm/num_fresh"] == 8 and metrics["rm/num_labelled"] == 8
        assert metrics["rm/num_replayed"] == 2  # round(0.2 * 8 / 0.8) = 2: 2 / (8 + 2) = 20%
        for key in ("rm/loss_on_policy", "rm/accuracy_on_policy", "rm/loss_after", "rm/accuracy_after"):
            assert math.isfinite(metrics[key])
    assert [m["rm/replay_size"] for m in history] == [40, 48, 48, 56]
    assert [m["rm/num_updates"] for m in (history[1], history[3])] == [1, 2]
    assert any(not torch.equal(w, p) for w, p in zip(rm_weights, rm.model.parameters()))
    # what the RM trained on: the 8 fresh labelled samples, then 2 replayed from the history at the time
    assert [len(d) for d in trained_on] == [10, 10]
    first = trained_on[0]
    expected_labels = {c: labels for c, labels in zip(COMPLETIONS, [[1, 1, 1], [1, 0, 0], [0, 0, 0], [1]])}
    for sample in first[:8]:
        assert sample["prompt"] == ROW["prompt"]
        assert sample["step_labels"] == expected_labels[sample["completion"]]
    assert all(json.dumps(s, sort_keys=True) in historical for s in first[8:])


def test_iterative_training_logs_and_saves_the_reward_model(tiny_model_dir, tmp_path):
    config = make_config(tmp_path, iteration_steps=1, max_steps=2, beta=0.04, replay_ratio=0.1)
    trainer = make_trainer(
        tiny_model_dir, tmp_path, config=config, iterative_reward_model=iterative_rm(history_size=8),
        rm_label_func=chain_step_reward,
    )  # fmt: skip
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    for line in lines:
        for key in ("rm/loss_on_policy", "rm/accuracy_after", "rm/replay_size", "rm/num_replayed"):
            assert key in line, key
    assert lines[1]["rm/replay_size"] == 8 + 4 + 4
    saved = tmp_path / "run" / "reward_model"
    assert (saved / "config.json").exists()
    assert len((saved / "replay_buffer.jsonl").read_text().splitlines()) == 16


def test_iterative_needs_a_label_function(tiny_model_dir, tmp_path):
    config = make_config(tmp_path, iteration_steps=1, beta=0.04)
    with pytest.raises(ValueError, match="rm_label_func is required"):
        make_trainer(tiny_model_dir, tmp_path, config=config, iterative_reward_model=iterative_rm(8))


def test_iterative_state_survives_a_resume(tiny_model_dir, tmp_path):
    config = make_config(tmp_path, iteration_steps=2, max_steps=1, save_steps=1, beta=0.04)
    first = make_trainer(
        tiny_model_dir,
        tmp_path,
        config=config,
        iterative_reward_model=iterative_rm(8),
        rm_label_func="chain_steps",
    )
    first.train()  # one step: 4 completions observed, no update yet; checkpoint-1 written
    assert len(first.iterative.pending) == 4
    second = make_trainer(
        tiny_model_dir,
        tmp_path,
        config=make_config(tmp_path, iteration_steps=2, max_steps=2, beta=0.04),
        iterative_reward_model=iterative_rm(8),
        rm_label_func="chain_steps",
    )
    second.step = second.run_state.resume(str(tmp_path / "run" / "checkpoint-1"), second.args.output_dir)
    assert len(second.iterative.pending) == 4
    assert params_equal(second.iterative.reward_model.model, first.iterative.reward_model.model)
    metrics = second.training_step()
    assert metrics["rm/num_fresh"] == 8  # the update sees the resumed observations too
