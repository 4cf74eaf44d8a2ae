"""DAPO dynamic sampling through GRPOTrainer, with a scripted backend and rewards: flat groups (every
completion rewarded alike) are dropped and further prompts sampled until the step is full, at most
``max_sampling_rounds`` rounds; no flat group is ever trained on; dropped rows are marked in
completions.jsonl; resume stays exact."""

from __future__ import annotations

import json

import pytest
import torch

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.rollout import ScriptedBackend

from ..conftest import small_config

# rows 0-5 are "flat" (all 4 completions say the same), rows 6-7 "informative" (completions differ)
ROWS = [{"prompt": f"{k}+0=", "solution": str(k)} for k in range(8)]
FLAT = {row["prompt"] for row in ROWS[:6]}


def respond(prompt: str, index: int) -> str:
    if prompt in FLAT:
        return "7"  # the same answer four times: one reward for the whole group
    return prompt[0] if index % 2 == 0 else "9"  # right, wrong, right, wrong


def exact(prompts, completions, completion_ids, solution, **kwargs):
    return [1.0 if c.strip() == s else 0.0 for c, s in zip(completions, solution)]


def make_trainer(tiny_model_dir, tmp_path, **overrides):
    values = {"max_steps": 1, "beta": 0.0, "shuffle_dataset": False, "dynamic_sampling": True,
              "learning_rate": 1e-2, "log_completions": True, **overrides}  # fmt: skip
    trainer = GRPOTrainer(str(tiny_model_dir), [exact], small_config(tmp_path, **values), train_dataset=ROWS)
    trainer.backend = ScriptedBackend(trainer.tokenizer, respond)
    trained: list[list[str]] = []
    rollout_batch = trainer.rollout_batch  # step 4: the groups this process trains on, batched

    def recording(samples, advantages):
        trained.append([row["prompt"] for row in samples.rows])
        return rollout_batch(samples, advantages)

    trainer.rollout_batch = recording
    return trainer, trained


def flat_params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_flat_groups_are_dropped_and_refilled_until_the_step_is_full(tiny_model_dir, tmp_path):
    """2 prompts per step, in order: rounds 1-3 draw rows 0-5 (flat), round 4 rows 6-7 (informative)."""
    trainer, trained = make_trainer(tiny_model_dir, tmp_path, max_sampling_rounds=4)
    (metrics,) = trainer.train()
    assert trained == [["6+0="] * 4 + ["7+0="] * 4]  # only the informative groups are trained on
    assert metrics["dynamic_sampling/rounds"] == 4
    assert metrics["dynamic_sampling/kept_groups"] == 2 and metrics["dynamic_sampling/dropped_groups"] == 6
    assert metrics["frac_reward_zero_std"] == 6 / 8  # describes everything sampled
    assert metrics["signal/frac_completions_nonzero_advantage"] == 8 / 32
    assert trainer.prompts.state_dict()["position"] == 8  # extra rounds consume prompts like any others
    records = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert len(records) == 32
    assert [r.get("kept", True) for r in records] == [False] * 24 + [True] * 8
    assert all(r["advantage"] == 0.0 for r in records[:24])
    assert [r["advantage"] > 0 for r in records[24:28]] == [True, False, True, False]


def test_sampling_stops_at_max_sampling_rounds_and_trains_on_nothing_flat(tiny_model_dir, tmp_path):
    trainer, trained = make_trainer(tiny_model_dir, tmp_path, max_sampling_rounds=2)
    before = flat_params(trainer.unwrapped_model)
    (metrics,) = trainer.train()
    assert trained == []  # rows 0-3 are all flat: no update at all
    assert torch.equal(flat_params(trainer.unwrapped_model), before)
    assert metrics["dynamic_sampling/rounds"] == 2 and metrics["dynamic_sampling/kept_groups"] == 0
    assert "loss" not in metrics


def test_a_short_step_trains_on_the_informative_groups_there_are(tiny_model_dir, tmp_path):
    """Rows 5 (flat) and 6 (informative) in round 3 of 3: one informative group, trained alone."""
    rows_order = [0, 1, 2, 3, 5, 6, 4, 7]
    trainer, trained = make_trainer(tiny_model_dir, tmp_path, max_sampling_rounds=3)
    trainer.prompts._order = rows_order  # a fixed order (the sampler walks its epoch order)
    (metrics,) = trainer.train()
    assert trained == [["6+0="] * 4]
    assert metrics["dynamic_sampling/kept_groups"] == 1 and metrics["dynamic_sampling/rounds"] == 3


def test_resume_with_dynamic_sampling_is_exact(tiny_model_dir, tmp_path):
    full, _ = make_trainer(tiny_model_dir, tmp_path / "a", max_steps=3, max_sampling_rounds=4)
    full.train()
    first, _ = make_trainer(tiny_model_dir, tmp_path / "b", max_steps=3, max_sampling_rounds=4, save_steps=1)
    first.args.max_steps = 3
    first.max_steps = 1  # stop after step 1 (its checkpoint holds the sampler position after 4 rounds)
    first.train()
    checkpoint = str(tmp_path / "b" / "run" / "checkpoint-1")
    resumed, _ = make_trainer(
        tiny_model_dir, tmp_path / "b", max_steps=3, max_sampling_rounds=4, resume_from_checkpoint=checkpoint
    )
    resumed.train()
    assert torch.equal(flat_params(full.unwrapped_model), flat_params(resumed.unwrapped_model))
    assert full.prompts.state_dict() == resumed.prompts.state_dict()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dynamic_sampling": True, "num_generations": 1}, "num_generations must be >= 2"),
        ({"dynamic_sampling": True, "max_sampling_rounds": 0}, "max_sampling_rounds must be >= 1"),
        ({"adaptive_num_generations": True, "min_num_generations": 1}, "min_num_generations must be >= 2"),
        ({"adaptive_num_generations": True, "num_generations": 8, "max_num_generations": 6},
         r"num_generations \(8\) is the mean group size"),
        ({"adaptive_num_generations": True, "dynamic_sampling": True}, "cannot be combined"),
        ({"generation_batch_size": 4, "num_generations": 8}, "generation_batch_size .* multiple of num_gen"),
    ],
)  # fmt: skip
def test_bad_sampling_settings_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**fields)
