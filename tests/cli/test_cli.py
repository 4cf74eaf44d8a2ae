"""The command line: a YAML recipe with overrides trains, evaluates, writes its files; bad input named."""

import json

import pytest
import yaml

from grpokit.cli import find_recipe, load_recipe, main, parse_train_args, to_flag_arguments


@pytest.fixture
def recipe(tmp_path, tiny_model_dir):
    path = tmp_path / "recipe.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": str(tiny_model_dir),
                "task": "arithmetic",
                "num_train_examples": 16,
                "num_eval_examples": 4,
                "output_dir": str(tmp_path / "run"),
                "max_steps": 2,
                "num_generations": 4,
                "per_device_train_batch_size": 8,
                "max_completion_length": 8,
                "disable_tqdm": True,
            }
        )
    )
    return path


def test_key_value_overrides_become_typed_options(recipe):
    args = parse_train_args(
        [str(recipe), "beta=0", "loss_type=dapo", "epsilon_high=0.28", "--max_steps", "3"]
    )
    assert (args.config.beta, args.config.loss_type, args.config.epsilon_high) == (0.0, "dapo", 0.28)
    assert args.config.max_steps == 3
    assert args.num_train_examples == 16  # recipe values stay unless overridden
    assert parse_train_args([str(recipe), "evaluate=false", "disable_tqdm=yes"]).evaluate is False
    assert to_flag_arguments(["reward_funcs=[accuracy, think_format]"]) == [
        "--reward_funcs",
        "accuracy",
        "think_format",
    ]


def test_train_from_recipe_with_override(recipe, tmp_path, capsys):
    assert main(["train", str(recipe), "beta=0.0", "max_steps=1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("memory plan: llama") and "  peak " in out  # printed before the weights load
    run = tmp_path / "run"
    summary = json.loads((run / "eval_summary.json").read_text())
    assert 0.0 <= summary["before"]["accuracy"] <= 1.0 and 0.0 <= summary["after"]["accuracy"] <= 1.0
    assert summary["wall_time_s"] > 0
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1]
    assert (run / "config.safetensors").exists() is False and (run / "config.json").exists()
    assert yaml.safe_load((run / "config.yaml").read_text())["beta"] == 0.0


@pytest.mark.parametrize(
    ("units", "extra", "bf16"), [("1", [], True), ("1", ["bf16=false"], False), ("0", [], False)]
)
def test_the_start_says_when_the_processor_chose_bf16(
    recipe, tmp_path, capsys, monkeypatch, units, extra, bf16
):
    monkeypatch.setenv("GRPOKIT_BF16_MATRIX_UNITS", units)
    assert main(["train", str(recipe), "max_steps=1", "evaluate=false", *extra]) == 0
    said = "grpokit: bf16 autocast, this CPU's default (it has bf16 matrix units); bf16=false for fp32"
    assert (said in capsys.readouterr().out) is bf16
    recorded = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert (recorded["bf16"], recorded["mixed_precision"]) == (bf16, "bf16" if bf16 else "no")


def test_lora_from_the_command_line(recipe, tmp_path):
    """TRL's ModelConfig names build the adapters; the run saves a peft adapter directory."""
    args = ["train", str(recipe), "use_peft=true", "lora_r=4", "lora_target_modules=[q_proj,v_proj]"]
    assert main([*args, "max_steps=1", "evaluate=false"]) == 0
    config = json.loads((tmp_path / "run" / "adapter_config.json").read_text())
    assert config["r"] == 4 and sorted(config["target_modules"]) == ["q_proj", "v_proj"]


def test_invalid_values_and_unknown_options_are_named(recipe, tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_train_args([str(recipe), "num_generations=1"])
    assert "GRPOConfig.num_generations must be >= 2" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: x\nbetta: 0.1\n")
    with pytest.raises(SystemExit, match="betta"):
        parse_train_args([str(bad)])
    with pytest.raises(SystemExit):
        parse_train_args([str(recipe), "loss_type=ppo"])  # not one of the choices: tyro says which are


def test_help_lists_options_with_their_docs(capsys):
    with pytest.raises(SystemExit):
        parse_train_args(["--help"])
    out = capsys.readouterr().out
    assert "--beta" in out and "KL coefficient" in out
    assert "--reward_funcs" in out and "--loss_type" in out


@pytest.mark.parametrize(
    "name",
    [
        "arithmetic-tiny",
        "arithmetic-dr-grpo",
        "arithmetic-dapo",
        "arithmetic-gspo",
        "arithmetic-cispo",
        "arithmetic-sapo",
        "deepseekmath-rl-7b",
        "r1-zero",
        "chain-outcome",
        "chain-process-rule",
        "chain-process-prm",
        "chain-iterative-prm",
        "chain-outcome-orm",
        "chain-iterative-orm",
        "maze-tiny",
        "calculator-tiny",
    ],
)
def test_shipped_recipes_load(name):
    args = load_recipe(find_recipe(name))
    assert args.config.num_generations >= 2


def test_recipe_base_is_extended():
    tiny = load_recipe(find_recipe("arithmetic-tiny"))
    dapo = load_recipe(find_recipe("arithmetic-dapo"))
    assert (dapo.config.loss_type, dapo.config.epsilon_high, dapo.config.beta) == ("dapo", 0.28, 0.0)
    assert dapo.config.max_steps == tiny.config.max_steps and dapo.model == tiny.model
    assert dapo.config.output_dir != tiny.config.output_dir


def test_a_multi_turn_task_trains_in_its_environment_and_is_evaluated_over_episodes(tiny_model_dir, tmp_path):
    out = tmp_path / "maze-run"
    argv = ["train", "task=maze", f"model={tiny_model_dir}", f"output_dir={out}", "max_steps=1",
            "num_train_examples=16", "num_eval_examples=4", "max_completion_length=12", "max_turns=3",
            "max_turn_tokens=2", "disable_tqdm=true"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((out / "eval_summary.json").read_text())
    for when in ("before", "after"):  # greedy episodes in the maze, graded by reaching the exit
        assert summary[when]["num_examples"] == 4 and 1 <= summary[when]["env/turns"] <= 3
        assert summary[when]["accuracy"] == summary[when].get("env/solved", 0.0)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert "env/turns" in metrics[-1] and "rewards/environment_reward/mean" in metrics[-1]
