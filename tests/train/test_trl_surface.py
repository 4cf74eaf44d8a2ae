"""What TRL's trainer exposes besides training, on grpokit's trainer: ``eval_loss`` and
``num_generations_eval``, named eval sets from a ``DatasetDict``, reward functions' ``log_metric`` /
``log_extra``, the run summary in ``state.log_history``, ``reward_processing_classes``, and TRL's
warnings."""

import json
import logging

import datasets
import pytest
import torch

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.rewards.reward_logs import RewardLogs

from .conftest import digit_reward


def make_config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "run"), max_steps=1, num_generations=4, per_device_train_batch_size=8,
        max_completion_length=6, learning_rate=1e-3, disable_tqdm=True, seed=0,
    )  # fmt: skip
    values.update(overrides)
    return GRPOConfig(**values)


def test_greedy_eval_loss_is_zero_at_the_start(tiny_model_dir, rows, tmp_path):
    """One greedy completion per prompt: every advantage is 0 and the policy is its own reference at the
    start, so the GRPO loss of the eval set is 0 exactly (policy term and KL)."""
    trainer = GRPOTrainer(str(tiny_model_dir), [digit_reward], make_config(tmp_path, beta=0.04),
                          train_dataset=rows, eval_dataset=rows)  # fmt: skip
    assert trainer.evaluate()["eval_loss"] == 0.0


def test_sampled_eval_loss_is_the_dapo_objective_of_the_eval_groups(tiny_model_dir, rows, tmp_path):
    """num_generations_eval=k: k sampled completions per prompt; with dapo and beta 0 the loss at ratio 1 is
    -sum_i A_i L_i / sum_i L_i (A_i the group-standardised reward, L_i the completion's length), computed
    here from the rewards and lengths the reward function saw."""
    seen = []

    def recorded(prompts, completions, completion_ids, solution, **kwargs):
        values = digit_reward(prompts, completions, completion_ids, solution)
        seen.extend(zip(values, (len(ids) for ids in completion_ids)))
        return values

    config = make_config(tmp_path, loss_type="dapo", beta=0.0, num_generations_eval=3, temperature=1.0)
    trainer = GRPOTrainer(str(tiny_model_dir), [recorded], config, train_dataset=rows)
    metrics = trainer.evaluate(eval_dataset=rows)
    rewards = torch.tensor([r for r, _ in seen]).view(len(rows), 3)  # [prompts, k]
    lengths = torch.tensor([n for _, n in seen], dtype=torch.float64)
    advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).view(-1)
    expected = -(advantages.double() * lengths).sum() / lengths.sum()
    assert len(seen) == 3 * len(rows)
    assert metrics["eval_loss"] == pytest.approx(float(expected), abs=1e-6)
    assert metrics["eval/reward"] == pytest.approx(float(rewards.mean()), abs=1e-6)


def test_num_generations_eval_is_checked(tmp_path):
    with pytest.raises(ValueError, match="num_generations_eval"):
        make_config(tmp_path, num_generations_eval=0)


def test_dataset_dict_eval_sets_are_named_sets(tiny_model_dir, rows, tmp_path):
    """A DatasetDict given as eval_dataset is evaluated split by split (TRL's reading), each equal to the
    split evaluated alone."""
    splits = datasets.DatasetDict({"a": datasets.Dataset.from_list(rows[:2]),
                                   "b": datasets.Dataset.from_list(rows[2:])})  # fmt: skip
    trainer = GRPOTrainer(str(tiny_model_dir), [digit_reward], make_config(tmp_path), train_dataset=rows,
                          eval_dataset=splits)  # fmt: skip
    named = trainer.evaluate()
    assert named["eval_a_loss"] == trainer.evaluate(rows[:2])["eval_loss"]
    assert named["eval/b/reward"] == trainer.evaluate(rows[2:])["eval/reward"]


def test_reward_functions_log_metrics_and_columns(tiny_model_dir, rows, tmp_path):
    """log_metric: the step's metric (the mean of the values logged); log_extra: a column of the step's
    logged completions, in completions.jsonl and TRL's trainer._logs["extra"]; the run's summary (the last
    state.log_history entry) carries the last step's metrics as TRL's does."""

    def scored(prompts, completions, completion_ids, solution, log_metric, log_extra, **kwargs):
        log_metric("custom/first_half", 1.0)
        log_metric("custom/first_half", 0.0)  # two calls in a step: the mean, 0.5
        log_extra("head", [c[:2] for c in completions])
        return digit_reward(prompts, completions, completion_ids, solution)

    config = make_config(tmp_path, max_steps=2, log_completions=True)
    trainer = GRPOTrainer(str(tiny_model_dir), [scored], config, train_dataset=rows)
    history = trainer.train()
    assert [h["custom/first_half"] for h in history] == [0.5, 0.5]
    lines = [json.loads(x) for x in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert all(line["extra"]["head"] == line["completion"][:2] for line in lines)
    assert trainer._logs["extra"]["head"] == [c[:2] for c in trainer._logs["completion"]]
    summary = trainer.state.log_history[-1]
    assert summary["train_loss"] == pytest.approx((history[0]["loss"] + history[1]["loss"]) / 2)
    assert summary["reward"] == history[-1]["reward"] and "loss" not in summary


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda logs: logs["log_metric"]("x", float("nan")), r"log_metric\('x', ...\): the value must be"),
        (lambda logs: logs["log_metric"]("", 1.0), "the metric name must be a non-empty string"),
        (lambda logs: logs["log_extra"]("c", [1]), r"log_extra\('c', ...\): 1 values for 2 completions"),
        (lambda logs: logs["log_extra"]("c", [object(), 1]), "must be JSON values"),
    ],
)
def test_bad_logged_values_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call(RewardLogs().keywords(2))


def test_reward_processing_classes_are_the_reward_models_tokenizers(tiny_model_dir, rows, tmp_path):
    trainer = GRPOTrainer(str(tiny_model_dir), [digit_reward], make_config(tmp_path), train_dataset=rows)
    assert trainer.reward_processing_classes == [None]  # a function, not a reward model
    assert trainer.aux_loss_enabled is False


def test_trl_warnings(tiny_model_dir, rows, tmp_path, caplog):
    """Sequence-level ratios with a token-summed loss, and a completion no reward function scores."""
    with caplog.at_level(logging.WARNING, logger="grpokit"):
        make_config(tmp_path, importance_sampling_level="sequence", loss_type="dapo")
        assert "weights each sequence by its completion length" in caplog.text
        caplog.clear()
        make_config(tmp_path, importance_sampling_level="sequence", loss_type="grpo")
        assert "weights each sequence" not in caplog.text

        def nothing(completions, **kwargs):
            return [None] * len(completions)

        trainer = GRPOTrainer(str(tiny_model_dir), [nothing, digit_reward], make_config(tmp_path),
                              train_dataset=rows)  # fmt: skip
        trainer.train()
        assert "All reward functions returned None" not in caplog.text  # digit_reward scores every row
        config = make_config(tmp_path / "none")
        trainer = GRPOTrainer(str(tiny_model_dir), [nothing], config, train_dataset=rows)
        trainer.train()
        assert "All reward functions returned None for the following kwargs" in caplog.text
