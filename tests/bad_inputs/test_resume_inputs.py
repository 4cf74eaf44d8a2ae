"""Resuming: every change of the config is honoured (and logged) or refused naming the field and both values,
a checkpoint that is missing, not one, or damaged is refused in one sentence when the trainer is built (before
any evaluation or step), and a resume on other data or another model is refused. One checkpoint is trained
for the module; each test works on its own copy."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.cli import main
from grpokit.config.trl_fields import TYPES
from grpokit.data.integrity import CorruptFileError
from grpokit.parallel.resume import ResumeError
from grpokit.parallel.resume_fields import FIELDS, HONOURED, NOT_COMPARED, REFUSED

from ..conftest import small_config

ROWS = [{"prompt": "1+1=", "solution": "2"}, {"prompt": "2+3=", "solution": "5"},
        {"prompt": "4+4=", "solution": "8"}, {"prompt": "7-2=", "solution": "5"}]  # fmt: skip


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    """A run of one step with a checkpoint at step 1 (learning_rate 1e-6, G=4, batch 8, seed 0)."""
    base = tmp_path_factory.mktemp("trained")
    config = small_config(base, save_steps=1)
    GRPOTrainer(str(tiny_model_dir), [length_reward], config, train_dataset=ROWS).train()
    return base / "run"


@pytest.fixture
def run_dir(trained, tmp_path):
    """This test's copy of the trained run's output_dir (checkpoint-1 inside)."""
    return shutil.copytree(trained, tmp_path / "run")


def resumed(model, tmp_path, rows=ROWS, **overrides) -> GRPOTrainer:
    values = {"save_steps": 1, "resume_from_checkpoint": "latest", "max_steps": 2, **overrides}
    config = small_config(tmp_path, **values)
    return GRPOTrainer(str(model), [length_reward], config, train_dataset=rows)


# -- honoured --
def test_a_new_learning_rate_is_the_one_the_next_step_uses(tiny_model_dir, run_dir, tmp_path, caplog):
    """Before: the optimizer's restored param groups and the scheduler's base rates brought the checkpoint's
    rate back, while config.yaml said the new one."""
    with caplog.at_level(logging.WARNING, logger="grpokit.parallel.resume"):
        trainer = resumed(tiny_model_dir, tmp_path, learning_rate=1e-3)
        trainer.train()
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["learning_rate"]) for m in metrics] == [(1, 1e-6), (2, 1e-3)]
    assert [group["lr"] for group in trainer.optimizer.param_groups] == [1e-3]
    assert "resuming checkpoint-1: learning_rate 1e-06 -> 0.001 (honoured" in caplog.text
    saved = yaml.safe_load((run_dir / "checkpoint-2" / "config.yaml").read_text())
    assert saved["learning_rate"] == 1e-3  # the checkpoint records what the run used


def test_a_learning_rate_of_zero_on_resume_leaves_the_weights_unchanged(tiny_model_dir, run_dir, tmp_path):
    """The effect, not only the logged number: AdamW with lr 0 (and no weight decay) moves nothing."""
    resumed(tiny_model_dir, tmp_path, learning_rate=0.0).train()
    before = load_file(str(run_dir / "checkpoint-1" / "model.safetensors"))
    after = load_file(str(run_dir / "checkpoint-2" / "model.safetensors"))
    assert before.keys() == after.keys()
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_the_other_optimizer_settings_are_the_new_configs(tiny_model_dir, run_dir, tmp_path):
    trainer = resumed(tiny_model_dir, tmp_path, weight_decay=0.1, adam_beta2=0.99, adam_epsilon=1e-6)
    trainer.run_state.resume("latest", trainer.args.output_dir)
    group = trainer.optimizer.param_groups[0]
    assert (group["weight_decay"], group["betas"], group["eps"]) == (0.1, (0.9, 0.99), 1e-6)


def test_a_new_schedule_continues_from_the_checkpoints_step(tiny_model_dir, run_dir, tmp_path):
    """linear over 4 optimizer steps, resumed after 1: the rate of step 2 is 1e-3 x (4 - 1) / 4."""
    trainer = resumed(tiny_model_dir, tmp_path, learning_rate=1e-3, lr_scheduler_type="linear", max_steps=4)
    trainer.run_state.resume("latest", trainer.args.output_dir)
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * 3 / 4)


def test_a_beta_above_zero_is_honoured(tiny_model_dir, run_dir, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="grpokit.parallel.resume"):
        resumed(tiny_model_dir, tmp_path, beta=0.02).run_state.resume("latest", run_dir)
    assert "beta 0.04 -> 0.02 (honoured" in caplog.text


# -- refused --
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"num_generations": 2},
            r"num_generations is 2 in this run but 4 in checkpoint-1 .*: the batch plan",
        ),
        (
            {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2},
            r"(?=.*per_device_train_batch_size is 4 in this run but 8 in checkpoint-1 )"
            r"(?=.*gradient_accumulation_steps is 2 in this run but 1 in checkpoint-1 ).*the batch plan",
        ),
        ({"generation_batch_size": 16}, r"generation_batch_size is 16 in this run but None in checkpoint-1"),
        ({"seed": 1}, r"seed is 1 in this run but 0 in checkpoint-1 .*: the data order"),
        ({"shuffle_dataset": False}, r"shuffle_dataset is False in this run but True"),
        ({"beta": 0.0}, r"beta is 0.0 in this run but 0.04 in checkpoint-1 .*: 0 means no reference model"),
        ({"num_iterations": 2}, r"num_iterations is 2 in this run but 1 in checkpoint-1"),
    ],
)
def test_a_change_the_checkpoint_cannot_follow_is_refused_when_the_trainer_is_built(
    tiny_model_dir, run_dir, tmp_path, overrides, message
):
    with pytest.raises(ResumeError, match=r"resume_from_checkpoint: " + message + r".*; resume with "):
        resumed(tiny_model_dir, tmp_path, **overrides)


def test_every_config_field_has_a_resume_rule():
    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert set(FIELDS) == names
    assert {rule.kind for rule in FIELDS.values()} == {HONOURED, REFUSED, NOT_COMPARED}


def test_the_reliability_doc_lists_every_field_as_the_table_does():
    doc = (Path(__file__).parents[2] / "docs" / "reliability.md").read_text()
    section = doc.split("## Resume: what may change", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "`" in line]
    assert any("TRL's other fields" in r and r.split(" | ")[1].startswith(NOT_COMPARED) for r in rows)
    for name, rule in FIELDS.items():
        if name in TYPES:  # (one row for them all)
            continue
        (row,) = [r for r in rows if f"`{name}`" in r.split(" | ")[0]]  # listed once
        kind = row.split(" | ")[1]
        assert kind.startswith(rule.kind), (name, kind)


def test_other_training_rows_are_refused(tiny_model_dir, run_dir, tmp_path):
    other = [{"prompt": "9+9=", "solution": "18"}, *ROWS[1:]]
    with pytest.raises(
        ResumeError, match=r"train_dataset is not the one checkpoint-1 .* trained on \(4 rows both"
    ):
        resumed(tiny_model_dir, tmp_path, rows=other)
    with pytest.raises(ResumeError, match=r"\(4 rows then, 3 now\)"):
        resumed(tiny_model_dir, tmp_path, rows=ROWS[:3])


def test_a_model_of_another_shape_is_refused(run_dir, tmp_path):
    from grpokit.models.tiny import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    wider = build_tiny_model(
        tokenizer, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=64, seed=0
    )
    wider.save_pretrained(tmp_path / "wider")
    tokenizer.save_pretrained(tmp_path / "wider")
    with pytest.raises(
        ResumeError, match=r"the model's hidden_size is 64 in this run but 32 in checkpoint-1"
    ):
        resumed(tmp_path / "wider", tmp_path)


def test_a_checkpoint_with_nothing_left_to_train_is_refused(tiny_model_dir, run_dir, tmp_path):
    with pytest.raises(ResumeError, match=r"checkpoint-1 .* is at step 1 and this run's max_steps is 1, so "):
        resumed(tiny_model_dir, tmp_path, max_steps=1)


# -- a checkpoint that is not one --
def test_a_resume_pointing_nowhere_is_refused_when_the_trainer_is_built(tiny_model_dir, run_dir, tmp_path):
    """Before: accepted here, then 'no *.safetensors weights' from inside train() (after the CLI's first
    evaluation)."""
    cases = [
        (
            tmp_path / "nonexistent",
            r"nonexistent does not exist; a checkpoint-<step> directory holds trainer_st",
        ),
        (run_dir, r"is not a checkpoint, it has no trainer_state.json \(it holds checkpoint-1: resume that"),
        (run_dir / "checkpoint-1" / "optimizer.pt", r"optimizer.pt is a file, not a checkpoint directory"),
    ]
    for path, message in cases:
        with pytest.raises(ResumeError, match=rf"resume_from_checkpoint={path}: .*{message}"):
            resumed(tiny_model_dir, tmp_path, resume_from_checkpoint=str(path))
    with pytest.raises(
        ResumeError, match=r"resume_from_checkpoint=latest: .*empty holds no complete checkpoint"
    ):
        resumed(tiny_model_dir, tmp_path, output_dir=str(tmp_path / "empty"))


@pytest.mark.parametrize(
    "name",
    [
        "optimizer.pt",
        "scheduler.pt",
        "rng_state.pt",
        "extra_state.pt",
        "trainer_state.json",
        "model.safetensors",
        "config.json",
        "config.yaml",
    ],
)
def test_a_truncated_checkpoint_file_is_named_as_corrupt(tiny_model_dir, run_dir, tmp_path, name):
    """Before: torch's 'failed finding central directory' reworded as 'holds more than tensors' (which
    reads as a refusal of hostile code), a bare JSONDecodeError, or safetensors' header error in train()."""
    file = run_dir / "checkpoint-1" / name
    file.write_bytes(file.read_bytes()[: len(file.read_bytes()) // 2])
    with pytest.raises(CorruptFileError) as refused:
        resumed(tiny_model_dir, tmp_path)
    text = str(refused.value)
    assert text.startswith(f"resume_from_checkpoint: {file} is corrupt or truncated (")
    assert "holds more than tensors" not in text


def test_a_checkpoint_from_another_process_count_is_refused_up_front(tiny_model_dir, run_dir, tmp_path):
    rng = run_dir / "checkpoint-1" / "rng_state.pt"
    states = torch.load(rng, weights_only=True)
    torch.save(states * 2, rng)  # as two processes save it
    with pytest.raises(ResumeError, match=r"was saved by 2 process\(es\), this run has 1; .*launch 2"):
        resumed(tiny_model_dir, tmp_path)


def test_a_corrupt_model_config_is_named(tiny_model_dir, tmp_path):
    """Before: transformers' OSError 'is not a valid JSON file' (a traceback on the command line)."""
    model = shutil.copytree(tiny_model_dir, tmp_path / "model")
    (model / "config.json").write_text('{"model_type": "llama", "hidden_')
    with pytest.raises(
        CorruptFileError, match=r"model: .*config.json is corrupt or truncated \(not valid JSON"
    ):
        GRPOTrainer(str(model), [length_reward], small_config(tmp_path), train_dataset=ROWS)


# -- the command line --
def recipe_args(model, out, *extra: str) -> list[str]:
    return [
        "train", "task=arithmetic", f"model={model}", f"output_dir={out}", "num_train_examples=8",
        "num_eval_examples=4", "num_generations=4", "per_device_train_batch_size=8",
        "max_completion_length=4", "disable_tqdm=true", "evaluate=false", *extra,
    ]  # fmt: skip


def test_the_command_line_honours_a_new_learning_rate_and_config_yaml_says_it(tiny_model_dir, tmp_path):
    out = tmp_path / "cli-run"
    assert main(recipe_args(tiny_model_dir, out, "max_steps=1", "save_steps=1", "save_strategy=steps")) == 0
    args = recipe_args(
        tiny_model_dir, out, "max_steps=2", "resume_from_checkpoint=latest", "learning_rate=0.001"
    )
    assert main(args) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["learning_rate"] == 0.001
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first = yaml.safe_load((out / "checkpoint-1" / "config.yaml").read_text())["learning_rate"]
    assert first != 1e-3 and [m["learning_rate"] for m in metrics] == [first, 1e-3]


def test_the_command_line_refuses_a_bad_resume_before_the_cold_start(tmp_path, monkeypatch):
    """``model=tiny:arithmetic`` would cold-start a policy (minutes) before the trainer noticed."""

    def no_cold_start(*args, **kwargs):
        raise AssertionError("the cold start ran")

    monkeypatch.setattr("grpokit.cli.train_command.resolve_model", no_cold_start)
    missing = tmp_path / "nonexistent"
    args = recipe_args(
        "tiny:arithmetic", tmp_path / "run", "max_steps=2", f"resume_from_checkpoint={missing}"
    )
    with pytest.raises(
        SystemExit, match=rf"^grpokit: resume_from_checkpoint={missing}: {missing} does not exist"
    ):
        main(args)
