"""Numerical guards: an optimizer step whose loss or gradient is NaN/inf is skipped (the weights stay),
counted as ``nonfinite_steps``, and ``max_nonfinite_steps`` GRPO steps in a row stop the run with an error
saying what to check; a step whose rewards are all None is reported."""

from __future__ import annotations

import logging

import pytest
import torch

from grpokit import GRPOTrainer
from grpokit.rollout import ScriptedBackend

from ..conftest import small_config
from .conftest import digit_reward


class NaNLoss:
    """The run's loss, made NaN on the calls listed in ``bad`` (0-based)."""

    def __init__(self, loss, bad):
        self.loss, self.bad, self.calls = loss, set(bad), 0
        self.is_global = loss.is_global

    def __call__(self, *args, **kwargs):
        value, metrics = self.loss(*args, **kwargs)
        self.calls += 1
        return (value * float("nan") if self.calls - 1 in self.bad else value), metrics


def make_trainer(tiny_model_dir, rows, tmp_path, bad, **overrides):
    config = small_config(tmp_path, **{"max_steps": 2, "learning_rate": 1e-2, **overrides})
    trainer = GRPOTrainer(str(tiny_model_dir), [digit_reward], config, train_dataset=rows)
    trainer.backend = ScriptedBackend(trainer.tokenizer, lambda prompt, i: ["2", "5", "12", "77"][i % 4])
    trainer.update_context.loss = NaNLoss(trainer.update_context.loss, bad)
    return trainer


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_a_nonfinite_step_is_skipped_and_counted(tiny_model_dir, rows, tmp_path):
    trainer = make_trainer(tiny_model_dir, rows, tmp_path, bad=[0], max_steps=1)
    before = flat(trainer.model).clone()
    history = trainer.train()
    assert history[0]["nonfinite_steps"] == 1.0
    assert torch.equal(flat(trainer.model), before)  # no update from NaN gradients
    assert trainer.optimizer.state_dict()["state"] == {}  # AdamW never stepped
    trainer.max_steps = 2
    history = trainer.train()  # the next step is finite and trains
    assert history[-1]["nonfinite_steps"] == 0.0
    assert not torch.equal(flat(trainer.model), before) and torch.isfinite(flat(trainer.model)).all()


def test_nonfinite_steps_in_a_row_stop_the_run(tiny_model_dir, rows, tmp_path):
    trainer = make_trainer(tiny_model_dir, rows, tmp_path, bad=range(10), max_steps=5, max_nonfinite_steps=2)
    with pytest.raises(RuntimeError, match=r"GRPO step 2: the loss or the gradients were NaN/inf in 2 steps"):
        trainer.train()
    assert trainer.step == 2


def test_a_step_without_any_reward_is_reported(tiny_model_dir, rows, tmp_path, caplog):
    def nothing(prompts, completions, completion_ids, **kwargs):
        return [None] * len(completions)

    trainer = GRPOTrainer(str(tiny_model_dir), [nothing], small_config(tmp_path), train_dataset=rows)
    with caplog.at_level(logging.WARNING, logger="grpokit.train.trainer"):
        trainer.train()
    assert "step 1: every reward is None/NaN: the step carries no learning signal" in caplog.text
