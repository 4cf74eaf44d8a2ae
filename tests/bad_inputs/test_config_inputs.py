"""Every bad configuration input, from Python, a recipe file and the command line: honoured as a user would
expect, or refused before anything runs with one sentence naming the field, the value and what to do.

The classes: derived fields (a source changed after the config was built, or over a recipe, is honoured);
YAML's words and strings (typed by the field's declared type); lengths, counts and intervals out of range;
options set that would do nothing. The last tests run ``grpokit train`` with a recipe and command-line
overrides of every derived field's source and compare what the run did with the ``config.yaml`` it wrote.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re

import pytest
import yaml

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.cli import main, parse_train_args
from grpokit.cli.recipes import load_recipe, to_flag_arguments
from grpokit.config import plan_batch
from grpokit.train.schedule import RunSchedule

from ..conftest import small_config

ROWS = [{"prompt": "1+1=", "solution": "2"}, {"prompt": "2+3=", "solution": "5"}]


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def recipe(tmp_path, text: str, name: str = "recipe.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def one_line(text: str) -> str:
    """tyro's error box as one line: borders dropped, wrapped lines joined."""
    return " ".join(text.replace("│", " ").replace("╭", " ").replace("╰", " ").replace("─", " ").split())


def schedule(config: GRPOConfig, max_steps: int) -> RunSchedule:
    """The run schedule of ``config`` over ``max_steps`` GRPO steps."""
    run = dataclasses.replace(config, max_steps=max_steps)
    return RunSchedule.from_config(run.resolved(), num_rows=100, plan=plan_batch(run))


# ---- refused outright --------------------------------------------------------------------------------------
def test_cispo_with_a_zero_cap():
    """Without epsilon_high the cap is epsilon (as TRL); a zero cap, either way, is refused."""
    with pytest.raises(ValueError, match=r"GRPOConfig.epsilon must be > 0 with loss_type='cispo'"):
        GRPOConfig(loss_type="cispo", epsilon=0.0)
    with pytest.raises(ValueError, match=r"GRPOConfig.epsilon_high must be > 0 with loss_type='cispo'"):
        GRPOConfig(loss_type="cispo", epsilon_high=0.0)


def test_a_group_of_one():
    with pytest.raises(ValueError, match=r"GRPOConfig.num_generations must be >= 2"):
        GRPOConfig(num_generations=1)


def test_null_on_the_command_line_is_none_not_the_text_null():
    assert parse_train_args(["task=null", "dataset=train.jsonl"]).task is None
    assert parse_train_args(["task=~", "dataset=train.jsonl"]).task is None


def test_a_recipe_key_with_a_typo(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", "arithmetic-tiny", "num_generation=4"])
    assert "num_generation" in capsys.readouterr().err


def test_environment_settings_out_of_range():
    with pytest.raises(ValueError, match=r"GRPOConfig.max_turns must be >= 1"):
        GRPOConfig(max_turns=0)
    with pytest.raises(ValueError, match=r"GRPOConfig.environment_timeout must be > 0 seconds"):
        GRPOConfig(environment_timeout=0)
    assert GRPOConfig(environment_kwargs={"step_penalty": "0.02", "mode": "step"}).environment_kwargs == {
        "step_penalty": 0.02,
        "mode": "step",
    }  # the command line's strings typed as YAML types them


def test_a_reuse_size_out_of_range():
    for value in (0, 4095, 2**30 + 1):
        with pytest.raises(ValueError, match=r"GRPOConfig.cpu_memory_reuse_below must be a size in bytes"):
            GRPOConfig(cpu_memory_reuse_below=value)
    assert GRPOConfig(cpu_memory_reuse_below=None).cpu_memory_reuse_below is None  # every block kept
    assert (
        parse_train_args(["cpu_memory_reuse_below=null", "dataset=t.jsonl"]).config.cpu_memory_reuse_below
        is None
    )
    assert (
        parse_train_args(["cpu_memory_reuse_below=65536", "dataset=t.jsonl"]).config.cpu_memory_reuse_below
        == 65536
    )


# ---- derived fields: a source changed after the config was built is honoured -------------------------------
@pytest.mark.parametrize(
    ("built", "change", "field", "expected"),
    [
        ({}, {"save_steps": 4}, "save_strategy", "steps"),  # today: stays "no", no checkpoint
        ({"save_steps": 5}, {"save_steps": 0}, "save_strategy", "no"),  # today: "save_steps must be >= 1"
        ({"eval_strategy": None}, {"eval_steps": 2}, "eval_strategy", "steps"),  # (None: derived)
        ({"eval_strategy": None, "eval_steps": 5}, {"eval_steps": None}, "eval_strategy", "no"),
        ({"eval_strategy": "steps"}, {"logging_steps": 3}, "eval_steps", 3),  # today: stays 1
        ({"bf16": True}, {"bf16": False}, "mixed_precision", "no"),  # today: stays "bf16"
        ({"adaptive_num_generations": True, "num_generations": 4, "per_device_train_batch_size": 24},
         {"num_generations": 6}, "max_num_generations", 12),  # today: stays 8
        ({"vllm_importance_sampling_cap": 5.0}, {"vllm_importance_sampling_cap": None},
         "vllm_importance_sampling_clip_max", 3.0),  # today: stays 5.0
        ({"generation_kwargs": {"temperature": 0.7}}, {"generation_kwargs": None}, "temperature", 1.0),
    ],
)  # fmt: skip
def test_a_source_changed_with_replace_is_honoured(built, change, field, expected):
    changed = dataclasses.replace(GRPOConfig(**built), **change)
    assert getattr(changed.resolved(), field) == expected


def test_a_config_keeps_what_was_set_and_resolves_what_it_derives():
    config = GRPOConfig(save_steps=4, bf16=True, generation_kwargs={"max_new_tokens": 33})
    assert (config.save_strategy, config.mixed_precision, config.max_completion_length) == (None, "no", 256)
    resolved = config.resolved()
    assert (resolved.save_strategy, resolved.mixed_precision, resolved.max_completion_length) == (
        "steps",
        "bf16",
        33,
    )
    assert resolved.resolved() == resolved  # resolving twice changes nothing


def test_save_steps_set_by_replace_writes_its_checkpoint(tiny_model_dir, tmp_path):
    """Today the config built with save_steps=0 keeps save_strategy='no': no checkpoint at all."""
    config = dataclasses.replace(small_config(tmp_path, max_steps=2), save_steps=2)
    GRPOTrainer(str(tiny_model_dir), [length_reward], config, train_dataset=ROWS).train()
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-2"]


# ---- derived fields: a command-line override of a recipe's source is honoured ------------------------------
@pytest.mark.parametrize(
    ("in_recipe", "override", "field", "expected"),
    [
        ("save_steps: 0", "save_steps=4", "save_strategy", "steps"),  # today: "no", no checkpoint
        ("save_steps: 5", "save_steps=0", "save_strategy", "no"),  # today: "save_steps must be >= 1 ..."
        ("eval_steps: 5", "eval_steps=null", "eval_strategy", "no"),  # today: evaluates every step
        ("logging_steps: 1", "eval_steps=2", "eval_strategy", "steps"),  # today: stays "no"
        ("eval_strategy: steps", "logging_steps=4", "eval_steps", 4),  # today: stays 1 (the recipe's)
        ("bf16: true", "bf16=false", "mixed_precision", "no"),  # today: stays "bf16"
        ("vllm_importance_sampling_cap: 5.0", "vllm_importance_sampling_cap=null",
         "vllm_importance_sampling_clip_max", 3.0),  # today: stays 5.0
        ("generation_kwargs: {temperature: 0.5}", "generation_kwargs=null", "temperature", 1.0),
        ("adaptive_num_generations: true", "num_generations=4", "max_num_generations", 8),  # today: 16
    ],
)  # fmt: skip
def test_a_command_line_override_of_a_recipe_source_is_honoured(
    tmp_path, in_recipe, override, field, expected
):
    path = recipe(tmp_path, f"base: arithmetic-tiny\n{in_recipe}\n")
    config = parse_train_args([str(path), override]).config
    assert getattr(config.resolved(), field) == expected


def test_eval_steps_null_over_a_recipe_never_evaluates(tmp_path):
    path = recipe(tmp_path, "base: arithmetic-tiny\neval_steps: 5\n")
    config = parse_train_args([str(path), "eval_steps=null"]).config
    assert not any(schedule(config, 10).evaluates(step) for step in range(1, 11))


def test_a_recipe_invalid_alone_is_completed_by_the_command_line(tmp_path):
    """The config is built once from the merged values: a recipe that needs its override is fine."""
    path = recipe(tmp_path, "base: arithmetic-tiny\nepsilon_high: 0.5\ndelta: 1.4\n")  # delta <= 1.5
    assert parse_train_args([str(path), "epsilon_high=0.28"]).config.epsilon_high == 0.28


# ---- YAML: words and strings typed by the field's declared type --------------------------------------------
def test_command_line_words_keep_their_meaning_for_text_fields():
    args = parse_train_args(["save_strategy=no", "run_name=no", "hub_model_id=yes", "project=off"])
    assert (args.config.save_strategy, args.config.run_name) == ("no", "no")  # today: refused / "False"
    assert (args.config.hub_model_id, args.config.project) == ("yes", "off")  # today: "True" / "False"


@pytest.mark.parametrize(
    ("word", "value"),
    [("yes", True), ("no", False), ("on", True), ("off", False), ("true", True), ("0", False)],
)
def test_boolean_options_take_yaml_words(word, value):
    args = parse_train_args([f"disable_tqdm={word}", f"evaluate={word}", "--use_cpu", word])
    assert (args.config.disable_tqdm, args.evaluate, args.config.use_cpu) == (value, value, value)


def test_to_flag_arguments_types_values_by_the_option():
    assert to_flag_arguments(["save_strategy=no", "disable_tqdm=no", "task=null", "run_name=null"]) == [
        "--save_strategy", "no", "--disable_tqdm", "False", "--task", "None", "--run_name", "None",
    ]  # fmt: skip
    assert to_flag_arguments(["lora_target_modules=[no, on]"]) == ["--lora_target_modules", "no", "on"]


def test_recipe_words_and_numbers_are_typed_by_the_field(tmp_path):
    path = recipe(tmp_path, "base: arithmetic-tiny\nsave_strategy: no\nproject: off\nlearning_rate: 1e-5\n"
                  "disable_tqdm: yes\nevaluate: no\nmax_steps: '7'\n")  # fmt: skip
    args = load_recipe(path)
    assert (args.config.save_strategy, args.config.project, args.config.learning_rate) == ("no", "off", 1e-5)
    assert (args.config.disable_tqdm, args.evaluate, args.config.max_steps) == (True, False, 7)


def test_python_values_are_typed_by_the_field_too():
    config = GRPOConfig(learning_rate="1e-5", max_steps="7", disable_tqdm="yes", run_name=5)
    assert (config.learning_rate, config.max_steps) == (1e-5, 7)
    assert (config.disable_tqdm, config.run_name) == (True, "5")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"learning_rate": "abc"}, "GRPOConfig.learning_rate must be a number, got 'abc'"),
        ({"num_generations": "four"}, "GRPOConfig.num_generations must be an integer, got 'four'"),
        ({"num_generations": 4.5}, "GRPOConfig.num_generations must be an integer, got 4.5"),
        ({"disable_tqdm": "maybe"}, "GRPOConfig.disable_tqdm must be true or false, got 'maybe'"),
        ({"save_strategy": False}, "GRPOConfig.save_strategy must be one of 'no', 'steps', 'epoch' or null, "
         "got False"),
        ({"run_name": True}, "GRPOConfig.run_name must be text or null, got True"),
        ({"temperature": float("nan")}, "GRPOConfig.temperature must be a number, got nan"),
        ({"loss_type": "ppo"}, "GRPOConfig.loss_type must be one of 'grpo', 'bnpo', 'dr_grpo', 'dapo', "
         "'cispo', 'sapo', 'luspo', 'vespo', got 'ppo'"),
        ({"routing_replay": "r3"}, "GRPOConfig.routing_replay must be one of 'off', 'R2', 'R3', got 'r3'"),
    ],
)  # fmt: skip
def test_a_value_that_does_not_convert_is_refused_naming_the_field(values, message):
    with pytest.raises(ValueError) as err:
        GRPOConfig(**values)
    assert str(err.value) == message


def test_a_recipe_value_that_does_not_convert_names_the_file(tmp_path, capsys):
    path = recipe(tmp_path, "base: arithmetic-tiny\nlearning_rate: fast\n")
    with pytest.raises(SystemExit) as err:
        parse_train_args([str(path)])
    assert str(err.value) == f"grpokit: {path}: GRPOConfig.learning_rate must be a number, got 'fast'"


def test_a_command_line_value_that_does_not_convert_names_the_option(capsys):
    with pytest.raises(SystemExit):
        parse_train_args(["learning_rate=fast"])
    assert "--learning_rate: could not convert string to float: 'fast'" in one_line(capsys.readouterr().err)


def test_a_recipe_that_is_not_yaml_is_one_line_naming_the_file_and_line(tmp_path):
    path = recipe(tmp_path, "model: x\nbeta: [0.1\nloss_type: dapo\n")
    with pytest.raises(SystemExit) as err:
        parse_train_args([str(path)])
    assert re.fullmatch(rf"grpokit: {re.escape(str(path))}, line \d: not valid YAML \(.+\)", str(err.value))
    assert "\n" not in str(err.value)


def test_a_config_file_that_is_not_yaml_names_the_file_and_line(tmp_path):
    path = recipe(tmp_path, "beta: 0.1\n  loss_type: dapo\n", name="config.yaml")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}, line 2: not valid YAML"):
        GRPOConfig.from_yaml(path)


def test_config_yaml_round_trips_the_words(tmp_path):
    config = GRPOConfig(save_strategy="no", run_name="no", project="off", learning_rate=1e-5)
    config.to_yaml(tmp_path / "config.yaml")
    assert GRPOConfig.from_yaml(tmp_path / "config.yaml") == config


# ---- lengths, counts and intervals out of range ------------------------------------------------------------
STEPS = "a whole number of steps >= 1 or a ratio in (0, 1) of the run's steps"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"max_prompt_length": -4}, "max_prompt_length must be >= 1 (or None: keep prompts whole), got -4"),
        ({"max_prompt_length": 0}, "max_prompt_length must be >= 1 (or None: keep prompts whole), got 0"),
        ({"save_total_limit": 0}, "save_total_limit must be >= 1 (or None: keep every checkpoint), got 0"),
        ({"logging_steps": 0}, f"logging_steps must be {STEPS}, got 0"),
        ({"logging_steps": 2.5}, f"logging_steps must be {STEPS}, got 2.5"),
        ({"eval_strategy": "steps", "eval_steps": 0}, f"eval_steps must be {STEPS}, got 0"),
        ({"save_steps": -2}, f"save_steps must be 0 (no periodic checkpoint), {STEPS}, got -2"),
        ({"save_steps": 1.5}, f"save_steps must be 0 (no periodic checkpoint), {STEPS}, got 1.5"),
        ({"per_device_eval_batch_size": 0}, "per_device_eval_batch_size must be >= 1, got 0"),
        ({"max_turns": 0}, "max_turns must be >= 1, got 0"),
        ({"max_turn_tokens": 0}, "max_turn_tokens must be >= 1 (or None: what is left of "
         "max_completion_length), got 0"),
        ({"generation_micro_batch_size": 0}, "generation_micro_batch_size must be >= 1 (or None: all of a "
         "step's prompts in one call), got 0"),
        ({"generation_batch_size": 0}, "generation_batch_size must be >= 1 (or None: derived from the batch "
         "sizes), got 0"),
        ({"num_completions_to_print": -1}, "num_completions_to_print must be >= 0 (or None: print none), "
         "got -1"),
        ({"max_steps": -5}, "max_steps must be >= 1, or -1 to run num_train_epochs passes over the prompts, "
         "got -5"),
        ({"max_completion_length": 0}, "max_completion_length must be >= 1, got 0"),
        ({"rm_epochs": 0}, "rm_epochs must be >= 1, got 0"),
        ({"rm_batch_size": 0}, "rm_batch_size must be >= 1, got 0"),
        ({"rm_buffer_capacity": 0}, "rm_buffer_capacity must be >= 1 (or None: no limit), got 0"),
        ({"vllm_server_port": 0}, "vllm_server_port must be a TCP port (1-65535), got 0"),
        ({"vllm_max_model_length": 0}, "vllm_max_model_length must be >= 1 (or None: max_prompt_length + "
         "max_completion_length), got 0"),
        ({"seed": -1}, "seed must be in [0, 2**32 - 1] (numpy's seeds), got -1"),
        ({"weight_decay": -0.1}, "weight_decay must be >= 0, got -0.1"),
        ({"max_grad_norm": -1.0}, "max_grad_norm must be >= 0, got -1.0"),
        ({"adam_beta2": 1.0}, "adam_beta2 must be in [0, 1), got 1.0"),
        ({"advantage_epsilon": -1e-4}, "advantage_epsilon must be >= 0, got -0.0001"),
        ({"output_dir": ""}, "output_dir must name a directory, got ''"),
    ],
)  # fmt: skip
def test_a_length_or_count_out_of_range_is_refused(values, message):
    """Today max_prompt_length=-4 cuts every prompt's first 4 tokens, 0 turns truncation off,
    save_total_limit=0 deletes every checkpoint, logging_steps=0 divides by zero after the first step."""
    with pytest.raises(ValueError) as err:
        GRPOConfig(**values)
    assert str(err.value) == f"GRPOConfig.{message}"


@pytest.mark.parametrize(
    ("interval", "max_steps", "acting_steps"),
    [(0.5, 4, [2, 4]), (0.3, 4, [2, 4]), (0.1, 25, [3, 6, 9, 12, 15, 18, 21, 24]), (2, 5, [2, 4])],
)
def test_interval_ratios_are_trls_ceil_of_the_run(interval, max_steps, acting_steps):
    """TRL: a ratio in (0, 1) of the run acts every ceil(ratio x max_steps) steps (0.3 x 4 = 1.2 -> 2)."""
    config = GRPOConfig(
        logging_steps=interval, eval_strategy="steps", eval_steps=interval, save_steps=interval
    )
    run = schedule(config, max_steps)
    steps = range(1, max_steps + 1)
    assert [s for s in steps if s % run.logging_steps == 0] == acting_steps
    assert [s for s in steps if run.evaluates(s)] == acting_steps
    assert [s for s in steps if run.saves(s)] == acting_steps


def test_a_logging_ratio_is_honoured_by_a_run(tiny_model_dir, tmp_path):
    """Today logging_steps=0.3 logs every step (step % 0.3 is never 0 only by float luck)."""
    config = small_config(tmp_path, max_steps=4, logging_steps=0.3)
    history = GRPOTrainer(str(tiny_model_dir), [length_reward], config, train_dataset=ROWS).train()
    assert [h["step"] for h in history] == [2, 4]


def test_an_interval_longer_than_the_run_is_said(caplog):
    with caplog.at_level(logging.WARNING, logger="grpokit"):
        schedule(GRPOConfig(save_steps=500), 100)
    said = "save_steps=500 is longer than the run's 100 steps: no periodic checkpoint is written"
    assert said in caplog.text


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("num_eval_examples=0", "num_eval_examples must be >= 1 (or None: the task's default; evaluate=false "
         "skips the evaluation), got 0"),
        ("num_train_examples=-3", "num_train_examples must be >= 1 (or None: the task's default), got -3"),
        ("eval_max_new_tokens=0", "eval_max_new_tokens must be >= 1 (or None: max_completion_length), got 0"),
        ("lora_r=0", "lora_r must be >= 1 (the adapters' rank), got 0"),
        ("lora_dropout=1.5", "lora_dropout must be in [0, 1), got 1.5"),
    ],
)  # fmt: skip
def test_a_train_option_out_of_range_is_refused(option, message, capsys):
    with pytest.raises(SystemExit):
        parse_train_args([option])
    assert message in one_line(capsys.readouterr().err)


# ---- options that would do nothing -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"eval_steps": 2, "eval_strategy": "no"},
         "eval_steps=2 has no effect with eval_strategy='no'; drop eval_steps, or set "
         "eval_strategy='steps'"),
        ({"eval_steps": 2, "eval_strategy": "epoch"},
         "eval_steps=2 has no effect with eval_strategy='epoch'; drop eval_steps, or set "
         "eval_strategy='steps'"),
        ({"max_num_generations": 16},
         "max_num_generations=16 has no effect without adaptive_num_generations=True; drop it, or turn "
         "adaptive group sizes on"),
        ({"warmup_ratio": 0.1, "warmup_steps": 2},
         "warmup_steps (2) and warmup_ratio (0.1) are both set, and warmup_steps would silently win; set "
         "only one of them"),
    ],
)  # fmt: skip
def test_an_option_that_would_do_nothing_is_refused(values, message):
    with pytest.raises(ValueError) as err:
        GRPOConfig(**values)
    assert str(err.value) == f"GRPOConfig.{message}"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"eval_strategy": "steps"}, "GRPOConfig.eval_strategy='steps' needs an eval_dataset to evaluate: "
         "pass eval_dataset to GRPOTrainer, or set eval_strategy='no'"),
        ({"eval_strategy": None, "eval_steps": 2}, "GRPOConfig.eval_steps=2 (which sets eval_strategy="
         "'steps') needs an eval_dataset to evaluate: pass eval_dataset to GRPOTrainer, or set "
         "eval_strategy='no'"),
        ({"eval_strategy": "epoch"}, "GRPOConfig.eval_strategy='epoch' needs an eval_dataset to evaluate: "
         "pass eval_dataset to GRPOTrainer, or set eval_strategy='no'"),
        ({"eval_on_start": True}, "GRPOConfig.eval_on_start=True needs an eval_dataset to evaluate: pass "
         "eval_dataset to GRPOTrainer, or set eval_on_start=False"),
    ],
)  # fmt: skip
def test_an_evaluation_schedule_without_an_eval_set_is_refused_at_construction(tmp_path, values, message):
    """Today the run trains to the end and logs no eval/* metric (TRL raises at construction). Refused before
    the model is even looked at (the path does not exist)."""
    with pytest.raises(ValueError) as err:
        GRPOTrainer(str(tmp_path / "no-model"), [length_reward], GRPOConfig(**values), train_dataset=ROWS)
    assert str(err.value) == message


def test_the_cli_refuses_an_evaluation_schedule_without_held_out_rows_before_the_cold_start(
    tmp_path, monkeypatch
):
    import grpokit.cli.train_command as train_command

    def no_cold_start(*args, **kwargs):
        raise AssertionError("the cold start ran before the refusal")

    monkeypatch.setattr(train_command, "resolve_model", no_cold_start)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1=", "solution": "2"}\n')
    with pytest.raises(SystemExit) as err:
        main(["train", "task=null", f"dataset={rows}", "reward_funcs=[accuracy]", "eval_steps=2"])
    assert str(err.value) == (
        "grpokit: GRPOConfig.eval_strategy='steps' needs an eval_dataset to evaluate: give "
        "eval_dataset=FILE (held-out rows), or set eval_strategy='no'"
    )


def test_the_default_command_line_run_does_not_need_eval_strategy():
    """``grpokit train`` evaluates through its own before/after check: no eval schedule, nothing refused."""
    config = parse_train_args([]).config
    assert config.resolved().eval_strategy == "no" and config.eval_steps is None


# ---- TRL's other fields, through every door ----------------------------------------------------------------
def test_trl_only_fields_in_a_recipe_and_on_the_command_line(tmp_path, caplog):
    path = recipe(tmp_path, "base: arithmetic-tiny\ndo_train: true\ntorch_compile: no\n")
    with caplog.at_level(logging.INFO, logger="grpokit"):
        args = parse_train_args([str(path), "dataloader_num_workers=4", "use_liger_kernel=false"])
    assert args.config.beta == 0.04
    assert "GRPOConfig.do_train=True has no effect in grpokit" in caplog.text
    assert "GRPOConfig.dataloader_num_workers=4 has no effect in grpokit" in caplog.text
    with pytest.raises(SystemExit) as err:
        parse_train_args(["torch_compile=true"])
    assert str(err.value) == (
        "grpokit: the command line: GRPOConfig.torch_compile=True is not supported: torch.compile is not "
        "supported yet"
    )
    bad = recipe(tmp_path, "base: arithmetic-tiny\nuse_liger_kernel: yes\n", name="liger.yaml")
    with pytest.raises(SystemExit, match=r"liger.yaml: GRPOConfig.use_liger_kernel='yes' is not supported"):
        parse_train_args([str(bad)])


# ---- grpokit train: what a run does is what its config.yaml says -------------------------------------------
RECIPE = """\
task: arithmetic
num_train_examples: 16
num_eval_examples: 4
max_steps: 4
num_generations: 4
per_device_train_batch_size: 8
max_completion_length: 8
disable_tqdm: yes
evaluate: no
learning_rate: 1e-3
lr_scheduler_type: linear
warmup_steps: 1
save_steps: 0
eval_strategy: steps
logging_steps: 1
bf16: true
generation_kwargs: {max_new_tokens: 16}
vllm_importance_sampling_cap: 5.0
adaptive_num_generations: true
"""
"""Each derived field's source set in the recipe, then overridden on the command line (OVERRIDES)."""

OVERRIDES = [
    "save_steps=2",  # -> save_strategy "steps" (today: the recipe's "no": no checkpoint)
    "logging_steps=2",  # -> eval_steps 2 under the recipe's eval_strategy (today: the recipe's 1)
    "bf16=false",  # -> mixed_precision "no" (today: the recipe's "bf16")
    "generation_kwargs=null",  # -> max_completion_length 8, the field (today: the recipe's 16)
    "vllm_importance_sampling_cap=null",  # -> clip_max 3.0, the field (today: the recipe's 5.0)
    "num_generations=2",  # -> max_num_generations 4 (today: the recipe's 8)
]


@pytest.fixture(scope="module")
def cli_run(tiny_model_dir, tmp_path_factory):
    """One ``grpokit train`` run of RECIPE with OVERRIDES: (its output_dir, config.yaml, metrics rows)."""
    tmp = tmp_path_factory.mktemp("cli-run")
    path = recipe(tmp, f"model: {tiny_model_dir}\noutput_dir: {tmp / 'run'}\n{RECIPE}")
    assert main(["train", str(path), *OVERRIDES]) == 0
    run = tmp / "run"
    config = yaml.safe_load((run / "config.yaml").read_text())
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return run, config, metrics


def test_config_yaml_records_every_overridden_source_resolved(cli_run):
    _, config, _ = cli_run
    assert (config["save_strategy"], config["save_steps"]) == ("steps", 2)
    assert (config["eval_strategy"], config["eval_steps"], config["logging_steps"]) == ("steps", 2, 2)
    assert (config["mixed_precision"], config["bf16"], config["fp16"]) == ("no", False, False)
    assert (config["max_completion_length"], config["generation_kwargs"]) == (8, None)
    assert config["vllm_importance_sampling_clip_max"] == 3.0
    assert config["vllm_importance_sampling_cap"] is None
    assert (config["num_generations"], config["max_num_generations"]) == (2, 4)
    assert config["learning_rate"] == 1e-3  # the recipe's "1e-3", a number (today: a TypeError)
    assert GRPOConfig.from_dict(config) == GRPOConfig.from_dict(config).resolved()  # a resolved record


def test_the_run_did_what_its_config_yaml_says(cli_run):
    run, config, metrics = cli_run
    steps = range(1, config["max_steps"] + 1)
    assert sorted(p.name for p in run.glob("checkpoint-*")) == [
        f"checkpoint-{s}" for s in steps if s % config["save_steps"] == 0
    ]  # save_steps=2: checkpoint-2, checkpoint-4
    assert [m["step"] for m in metrics] == [s for s in steps if s % config["logging_steps"] == 0]
    evaluated = [m["step"] for m in metrics if "eval/reward" in m]
    assert evaluated == [s for s in steps if s % config["eval_steps"] == 0]
    assert all(m["completions/max_length"] <= config["max_completion_length"] for m in metrics)
    # linear schedule, warm-up w optimizer steps, T in all (one optimizer step per GRPO step): after k steps
    # the rate is lr * k / w while warming up, then lr * (T - k) / (T - w); logged after each step's update
    total, warmup, peak = config["max_steps"], config["warmup_steps"], config["learning_rate"]
    for m in metrics:
        k = m["step"]
        expected = peak * k / warmup if k < warmup else peak * (total - k) / (total - warmup)
        assert m["learning_rate"] == pytest.approx(expected)  # step 2: 2/3 x 1e-3, step 4: 0


def test_save_steps_and_eval_steps_on_the_command_line_over_the_default_recipe(tiny_model_dir, tmp_path):
    """The issue's commands: ``grpokit train save_steps=4`` writes checkpoint-4 (today: none), and
    ``eval_steps=2`` logs eval/* every 2 steps (today: eval_strategy stays "no")."""
    out = tmp_path / "run"
    argv = ["train", f"model={tiny_model_dir}", f"output_dir={out}", "max_steps=4", "num_train_examples=16",
            "num_eval_examples=4", "num_generations=4", "per_device_train_batch_size=8",
            "max_completion_length=6", "disable_tqdm=true", "evaluate=false",
            "save_steps=4", "eval_steps=2"]  # fmt: skip
    assert main(argv) == 0
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4"]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "eval/reward" in m] == [2, 4]
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert (config["save_strategy"], config["eval_strategy"], config["eval_steps"]) == ("steps", "steps", 2)
