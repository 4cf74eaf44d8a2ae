"""TRL's TrainerCallback interface on GRPOTrainer, and when a run logs, evaluates, saves and stops
(eval/save strategies, max_steps_unit, logging_first_step, eval_on_start), plus TRL's optimizer fields."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from transformers import TrainerCallback

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.models.policy import model_init_kwargs
from grpokit.rollout import ScriptedBackend

from ..conftest import small_config
from .conftest import digit_reward


class Recorder(TrainerCallback):
    """Records (event, global_step, epoch) and what on_log / on_evaluate received."""

    def __init__(self, stop_at=None, save_at=None, evaluate_at=None):
        self.events, self.logs, self.evaluations = [], [], []
        self.stop_at, self.save_at, self.evaluate_at = stop_at, save_at, evaluate_at
        self.objects = None

    def _record(self, name, state):
        self.events.append((name, state.global_step, state.epoch))

    def on_init_end(self, args, state, control, **kwargs):
        self._record("init_end", state)
        self.objects = kwargs

    def on_train_begin(self, args, state, control, **kwargs):
        self._record("train_begin", state)

    def on_step_begin(self, args, state, control, **kwargs):
        self._record("step_begin", state)

    def on_step_end(self, args, state, control, **kwargs):
        self._record("step_end", state)
        control.should_training_stop = state.global_step == self.stop_at
        control.should_save = state.global_step == self.save_at
        control.should_evaluate = state.global_step == self.evaluate_at

    def on_log(self, args, state, control, logs=None, **kwargs):
        self._record("log", state)
        self.logs.append(dict(logs))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self._record("evaluate", state)
        self.evaluations.append(dict(metrics))

    def on_save(self, args, state, control, **kwargs):
        self._record("save", state)

    def on_epoch_end(self, args, state, control, **kwargs):
        self._record("epoch_end", state)

    def on_train_end(self, args, state, control, **kwargs):
        self._record("train_end", state)


def make_trainer(tiny_model_dir, rows, tmp_path, callbacks=None, eval_dataset=None, **overrides):
    """4 rows, 2 prompts x G=4 per step: an epoch is 2 steps."""
    config = small_config(tmp_path, **{"max_steps": 3, "beta": 0.0, **overrides})
    trainer = GRPOTrainer(
        str(tiny_model_dir), [digit_reward], config, train_dataset=rows, eval_dataset=eval_dataset,
        callbacks=callbacks,
    )  # fmt: skip
    trainer.backend = ScriptedBackend(trainer.tokenizer, lambda prompt, i: ["2", "5", "12", "77"][i % 4])
    return trainer


def metrics_steps(tmp_path):
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_callbacks_get_every_event_in_trl_order_with_the_state(tiny_model_dir, rows, tmp_path):
    recorder = Recorder()
    trainer = make_trainer(tiny_model_dir, rows, tmp_path, callbacks=[recorder])
    trainer.train()
    step = [("step_begin",), ("step_end",), ("log",)]
    expected = [("init_end", 0), ("train_begin", 0)]
    for s in (1, 2, 3):
        expected += [(e[0], s - 1 if e[0] == "step_begin" else s) for e in step]
        if s == 2:
            expected.append(("epoch_end", 2))
    expected += [("log", 3), ("train_end", 3)]  # the run's summary is logged last, as transformers does
    assert [(e, s) for e, s, _ in recorder.events] == expected
    assert [epoch for e, _, epoch in recorder.events if e == "step_end"] == [0.5, 1.0, 1.5]
    steps = metrics_steps(tmp_path)
    assert recorder.logs[:-1] == [{k: v for k, v in r.items() if k != "step"} for r in steps]
    assert recorder.objects["model"] is trainer.model and recorder.objects["optimizer"] is trainer.optimizer
    assert recorder.objects["processing_class"] is trainer.tokenizer
    # TRL's trainer.state: every logged step, then the summary with train_loss (the steps' mean loss)
    assert trainer.state is trainer.callbacks.state
    assert trainer.state.global_step == trainer.state.max_steps == 3
    assert [r["step"] for r in trainer.state.log_history] == [1, 2, 3, 3]
    summary = trainer.state.log_history[-1]
    assert summary["train_loss"] == pytest.approx(sum(r["loss"] for r in steps) / 3)
    assert summary["epoch"] == 1.5 and summary["train_runtime"] > 0 and "loss" not in summary


def test_train_returns_the_logged_steps_with_trainoutput_fields(tiny_model_dir, rows, tmp_path):
    """``train()`` returns the logged metrics (a list) carrying transformers' TrainOutput fields; a reward
    function gets the TrainerState as ``trainer_state`` (TRL's attribute access, and grpokit's keys)."""
    seen = []

    def state_reward(prompts, completions, completion_ids, trainer_state, **kwargs):
        seen.append((trainer_state.global_step, trainer_state["max_steps"]))
        return [1.0] * len(completions)

    config = small_config(tmp_path, max_steps=2, beta=0.0)
    trainer = GRPOTrainer(str(tiny_model_dir), [digit_reward, state_reward], config, train_dataset=rows)
    trainer.backend = ScriptedBackend(trainer.tokenizer, lambda prompt, i: ["2", "5", "12", "77"][i % 4])
    result = trainer.train()
    assert [r["step"] for r in result] == [1, 2] and result.global_step == 2
    assert result.training_loss == pytest.approx((result[0]["loss"] + result[1]["loss"]) / 2)
    summary = trainer.state.log_history[-1]  # the run's metrics, and (as TRL's) the last step's
    assert result.metrics == {k: summary[k] for k in result.metrics}
    assert summary["reward"] == result[-1]["reward"] and "loss" not in summary
    assert seen == [(0, 2), (1, 2)]  # the state as the step began


def test_a_callback_can_stop_the_run_and_ask_for_a_checkpoint(tiny_model_dir, rows, tmp_path):
    recorder = Recorder(stop_at=2, save_at=1)
    history = make_trainer(tiny_model_dir, rows, tmp_path, callbacks=[recorder]).train()
    assert [r["step"] for r in history] == [1, 2]  # step 2 runs to its end (logged), then the run stops
    assert (tmp_path / "run" / "checkpoint-1").is_dir() and ("save", 1, 0.5) in recorder.events
    assert (tmp_path / "run" / "config.json").exists()  # the final model is saved after a requested stop
    assert recorder.events[-1][:2] == ("train_end", 2)


def test_eval_strategies_on_start_by_epoch_and_on_request(tiny_model_dir, rows, tmp_path):
    recorder = Recorder(evaluate_at=3)
    trainer = make_trainer(
        tiny_model_dir, rows, tmp_path, callbacks=[recorder], eval_dataset=rows[:2],
        eval_strategy="epoch", eval_on_start=True, per_device_eval_batch_size=1,
    )  # fmt: skip
    trainer.train()
    evaluated = [s for e, s, _ in recorder.events if e == "evaluate"]
    assert evaluated == [0, 2, 3]  # before the first step, at the end of epoch 1 (step 2), requested at 3
    logged = metrics_steps(tmp_path)
    assert [r["step"] for r in logged] == [0, 1, 2, 3]
    assert [("eval/reward" in r) for r in logged] == [True, False, True, True]
    assert recorder.evaluations[0]["eval/reward"] == logged[0]["eval/reward"]


def test_save_strategy_epoch_and_logging_first_step(tiny_model_dir, rows, tmp_path):
    trainer = make_trainer(
        tiny_model_dir, rows, tmp_path, max_steps=4, save_strategy="epoch", logging_steps=3,
        logging_first_step=True,
    )  # fmt: skip
    trainer.train()
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert [r["step"] for r in metrics_steps(tmp_path)] == [1, 3, 4]


@pytest.mark.parametrize(("max_steps", "grpo_steps"), [(4, 2), (3, 2)])
def test_max_steps_in_optimizer_steps_like_trl(tiny_model_dir, rows, tmp_path, caplog, max_steps, grpo_steps):
    """mu = 2: each GRPO step takes 2 optimizer steps, so TRL's max_steps=4 is 2 GRPO steps; 3 rounds up
    (with a warning saying so)."""
    with caplog.at_level(logging.WARNING):
        trainer = make_trainer(
            tiny_model_dir, rows, tmp_path, max_steps=max_steps, max_steps_unit="optimizer_steps",
            num_iterations=2,
        )  # fmt: skip
    assert trainer.max_steps == grpo_steps
    assert ("not a multiple" in caplog.text) == (max_steps == 3)
    trainer.train()
    assert trainer.scheduler.scheduler.last_epoch == 2 * grpo_steps  # optimizer steps taken


def test_trl_optimizer_fields_reach_adamw_and_the_schedule(tiny_model_dir, rows, tmp_path):
    trainer = make_trainer(
        tiny_model_dir, rows, tmp_path, optim="adamw_torch_fused", adam_epsilon=1e-5, learning_rate=1.0,
        lr_scheduler_type="cosine", lr_scheduler_kwargs={"num_cycles": 1.0}, max_steps=4,
    )  # fmt: skip
    assert trainer.optimizer.defaults["eps"] == 1e-5 and trainer.optimizer.defaults["fused"] is True
    trainer.train()
    # cosine with num_cycles=1 over 4 steps: lr(k) = 0.5 (1 + cos(2 pi k / 4)); after 4 steps: k = 4 -> 1.0
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(0.5 * (1 + math.cos(2 * math.pi)))
    lrs = [r["learning_rate"] for r in metrics_steps(tmp_path)]
    assert lrs == pytest.approx([0.5 * (1 + math.cos(2 * math.pi * k / 4)) for k in (1, 2, 3, 4)])


def test_adamw_is_fused_by_default_and_plain_where_torch_has_no_fused_kernel(caplog):
    from grpokit.parallel.optim import build_optimizers

    cpu = torch.nn.Linear(3, 2)
    fused, _ = build_optimizers(cpu, GRPOConfig(), total_optimizer_steps=1)
    plain, _ = build_optimizers(cpu, GRPOConfig(optim="adamw_torch"), total_optimizer_steps=1)
    assert fused.defaults["fused"] is True and not plain.defaults["fused"]
    meta = torch.nn.Linear(3, 2, device="meta")  # a device without the fused kernel
    with caplog.at_level(logging.WARNING):
        fallback, _ = build_optimizers(meta, GRPOConfig(), total_optimizer_steps=1)
    assert not fallback.defaults["fused"] and "no fused kernel for ['meta/torch.float32']" in caplog.text


def test_trust_remote_code_reaches_from_pretrained():
    assert model_init_kwargs(GRPOConfig(trust_remote_code=True))["trust_remote_code"] is True
    assert "trust_remote_code" not in model_init_kwargs(GRPOConfig())
    assert model_init_kwargs(GRPOConfig())["dtype"] is torch.float32


def test_a_callback_without_any_event_is_refused(tiny_model_dir, rows, tmp_path):
    with pytest.raises(ValueError, match="callbacks: object is not a TrainerCallback"):
        make_trainer(tiny_model_dir, rows, tmp_path, callbacks=[object()])


def test_data_seed_orders_the_prompts_instead_of_seed():
    from grpokit.train.prompts import PromptSampler

    def first_epoch(**fields):
        return PromptSampler(10, 10, GRPOConfig(**fields)).next_indices()

    expected = torch.randperm(10, generator=torch.Generator().manual_seed(7)).tolist()
    assert first_epoch(seed=1, data_seed=7) == expected == first_epoch(seed=7)
    assert first_epoch(seed=1) != expected


def test_a_callback_can_ask_for_a_log_line(tiny_model_dir, rows, tmp_path):
    class LogStepTwo(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_log = state.global_step == 2

    trainer = make_trainer(
        tiny_model_dir, rows, tmp_path, callbacks=[LogStepTwo], logging_steps=3, max_steps=3
    )
    trainer.train()
    assert [r["step"] for r in metrics_steps(tmp_path)] == [2, 3]  # step 2 asked for; step 3 by logging_steps
