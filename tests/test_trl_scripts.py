"""Where TRL users run GRPO: TRL 1.16's own parser and script, with grpokit's ``GRPOConfig`` and
``GRPOTrainer`` in place of TRL's. ``HfArgumentParser`` / ``TrlParser`` build a parser from grpokit's
``GRPOConfig`` with every flag of TRL's dataclass; an open-r1-style subclass parses from YAML and trains;
``trl/scripts/grpo.py`` (what ``trl grpo`` runs), its two imports changed, trains with TRL's command line on
a local model and data set, alone and under ``accelerate launch`` with TRL's ZeRO-3 and FSDP2 configs on two
CPU processes; ``grpokit train`` reads a TRL YAML and TRL's ``--flag value`` forms. Skipped without TRL."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
import typing
from pathlib import Path

import pytest

trl = pytest.importorskip("trl")
if trl.__version__ != "1.16.0":  # the script and fields below are TRL 1.16's
    pytest.skip(f"TRL {trl.__version__} is installed; these tests read TRL 1.16.0", allow_module_level=True)

from transformers import HfArgumentParser  # noqa: E402
from trl import ModelConfig, ScriptArguments, TrlParser  # noqa: E402

from grpokit import GRPOConfig, GRPOTrainer  # noqa: E402
from grpokit.cli import main  # noqa: E402

ROWS = [{"prompt": [{"role": "user", "content": f"What is {a}+{b}?"}], "solution": f"${a + b}$"}
        for a in range(4) for b in range(4)]  # fmt: skip


@dataclasses.dataclass
class OpenR1Config(GRPOConfig):
    """open-r1's pattern (``open_r1/configs.py``): TRL's GRPOConfig with fields of its own."""

    benchmarks: list[str] = dataclasses.field(default_factory=list)
    system_prompt: str | None = None
    hub_model_revision: str | None = "main"
    wandb_entity: str | None = None
    num_completions_to_print: int = 0  # (redeclared, as open-r1 does)


def _cli_text(value: object) -> list[str]:
    """A value as command-line words (HfArgumentParser's forms)."""
    if isinstance(value, bool):
        return [str(value).lower()]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    if isinstance(value, dict):
        return [json.dumps(value)]
    return [str(value)]


def test_every_trl_flag_parses_with_trls_default_and_means_it():
    """``HfArgumentParser(GRPOConfig)`` has a flag for every field of TRL 1.16's GRPOConfig; given TRL's
    default for each (every flag at once), it builds a config holding those values."""
    parser = HfArgumentParser(GRPOConfig)
    flags = {option for action in parser._actions for option in action.option_strings}
    trl_fields = dataclasses.fields(trl.GRPOConfig)
    assert [f.name for f in trl_fields if f"--{f.name}" not in flags] == []
    argv, expected = [], {}
    for field in trl_fields:
        default = field.default if field.default_factory is dataclasses.MISSING else field.default_factory()
        default = getattr(default, "value", default)  # TRL's enums: their text
        if default in (None, [], "") or field.name in ("output_dir", "logging_dir"):
            continue  # (no words say None; TRL derives these two)
        argv += [f"--{field.name}", *_cli_text(default)]
        expected[field.name] = default
    (config,) = parser.parse_args_into_dataclasses(argv)
    for name, value in expected.items():
        got = getattr(config, name)
        if name == "report_to":
            value = [] if value == "none" else [value]
        same = got == value or (got in ("no", False) and value in ("no", False))  # (TRL's parser: "no" False)
        assert same or (isinstance(value, float) and got == pytest.approx(value)), (name, got, value)
    assert config.loss_type == "dapo" and config.beta == 0.0  # TRL's defaults, TRL's meaning


def test_lists_dicts_booleans_and_optional_values_parse_as_hfargumentparser_gives_them():
    parser = HfArgumentParser(GRPOConfig)
    (config,) = parser.parse_args_into_dataclasses([
        "--reward_weights", "1", "0.5", "--model_init_kwargs", '{"dtype": "bfloat16"}', "--bf16", "false",
        "--log_completions", "--max_prompt_length", "64",
        "--chat_template_kwargs", '{"enable_thinking": false}',
        "--report_to", "none", "--logging_steps", "0.25", "--save_steps", "10",
    ])  # fmt: skip
    assert config.reward_weights == [1.0, 0.5] and config.model_init_kwargs == {"dtype": "bfloat16"}
    assert config.bf16 is False and config.log_completions is True and config.max_prompt_length == 64
    assert config.chat_template_kwargs == {"enable_thinking": False} and config.report_to == []
    assert config.logging_steps == 0.25 and config.save_steps == 10 and isinstance(config.save_steps, int)
    with pytest.raises(ValueError, match=r"torch_compile=True is not supported: torch\.compile"):
        parser.parse_args_into_dataclasses(["--torch_compile", "true"])  # a flag, refused with its reason


def test_an_open_r1_style_subclass_parses_from_yaml_trains_and_round_trips(tiny_model_dir, tmp_path):
    config_file = tmp_path / "grpo.yaml"
    config_file.write_text(
        "model_name_or_path: model\ndataset_name: data\noutput_dir: " + str(tmp_path / "run") + "\n"
        "benchmarks: [math_500, aime24]\nsystem_prompt: Think step by step.\nlearning_rate: 1.0e-5\n"
        "num_generations: 4\nper_device_train_batch_size: 8\nmax_completion_length: 6\nmax_steps: 1\n"
        "num_completions_to_print: 2\nreport_to: none\n"
    )
    parser = TrlParser((ScriptArguments, OpenR1Config, ModelConfig))
    script, config, model = parser.parse_args_and_config(["--config", str(config_file), "--max_steps", "2"])
    assert type(config) is OpenR1Config and config.benchmarks == ["math_500", "aime24"]
    assert (
        config.system_prompt == "Think step by step."
        and config.max_steps == 2
        and config.learning_rate == 1e-5
    )
    assert model.model_name_or_path == "model" and script.dataset_name == "data"
    copy = dataclasses.replace(config, max_steps=1)
    assert type(copy) is OpenR1Config and copy.benchmarks == config.benchmarks
    assert dataclasses.asdict(config)["benchmarks"] == config.to_dict()["benchmarks"]
    assert json.loads(config.to_json_string())["system_prompt"] == "Think step by step."
    assert pickle.loads(pickle.dumps(config)) == config  # (processes exchange it)
    trainer = GRPOTrainer(str(tiny_model_dir), ["think_format"], copy, train_dataset=ROWS)
    assert type(trainer.args) is OpenR1Config and trainer.args.benchmarks == ["math_500", "aime24"]
    assert len(trainer.train()) == 1


def test_the_subclass_field_is_carried_through_a_checkpoint_and_resume(tiny_model_dir, tmp_path):
    config = OpenR1Config(
        output_dir=str(tmp_path / "run"), max_steps=1, save_steps=1, num_generations=4,
        per_device_train_batch_size=8, max_completion_length=4, benchmarks=["a"],
    )  # fmt: skip
    GRPOTrainer(str(tiny_model_dir), ["think_format"], config, train_dataset=ROWS).train()
    resumed = dataclasses.replace(config, max_steps=2, benchmarks=["b"], resume_from_checkpoint="latest")
    assert len(GRPOTrainer(str(tiny_model_dir), ["think_format"], resumed, train_dataset=ROWS).train()) == 1


# ---- TRL's script ---------------------------------------------------------------------------------------
IMPORTS = {
    "    from trl import GRPOTrainer, get_dataset, get_peft_config, get_quantization_config\n": (
        "    from grpokit import GRPOTrainer\n"
        "    from trl import get_dataset, get_peft_config, get_quantization_config\n"
    ),
    "    from trl import DatasetMixtureConfig, GRPOConfig, ModelConfig, TrlParser\n": (
        "    from grpokit import GRPOConfig\n"
        "    from trl import DatasetMixtureConfig, ModelConfig, TrlParser\n"
    ),
}
"""The script's two imports of GRPOTrainer and GRPOConfig, and what they become."""


@pytest.fixture(scope="module")
def script(tiny_model_dir, tmp_path_factory) -> Path:
    """A folder holding TRL's ``grpo.py`` with grpokit's two classes, a local data set (train and test
    splits, TRL's conversational prompts with a ``solution``) and the tiny policy."""
    import trl.scripts.grpo as trl_script

    root = tmp_path_factory.mktemp("trl-script")
    source = Path(trl_script.__file__).read_text()
    for old, new in IMPORTS.items():
        assert source.count(old) == 1
        source = source.replace(old, new)
    (root / "grpo.py").write_text(source)
    (root / "data").mkdir()
    (root / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS[:12]))
    (root / "data" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS[12:]))
    (root / "model").symlink_to(tiny_model_dir)
    return root


def trl_command(out: str, *extra: str) -> list[str]:
    """TRL's documented ``grpo.py`` command line (docs: ``trl grpo --model_name_or_path ... --dataset_name ...
    --reward_funcs accuracy_reward``), sized for the tiny model."""
    return [
        "grpo.py", "--model_name_or_path", "model", "--dataset_name", "data", "--reward_funcs",
        "accuracy_reward", "--output_dir", out, "--learning_rate", "1e-5",
        "--per_device_train_batch_size", "8",
        "--num_generations", "4", "--max_completion_length", "8", "--max_steps", "2", "--logging_steps", "1",
        "--report_to", "none", *extra,
    ]  # fmt: skip


def run(script: Path, command: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    env["OMP_NUM_THREADS"] = "1"
    env["TMPDIR"] = str(script / "tmp")  # (accelerate launch's torchelastic_* log folders: not the system's)
    (script / "tmp").mkdir(exist_ok=True)
    return subprocess.run(command, cwd=script, env=env, capture_output=True, text=True, timeout=1800)


def assert_trained(script: Path, out: str, done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Training completed." in done.stdout and f"Model saved to {out}." in done.stdout
    folder = script / out
    assert (folder / "config.json").exists() and (folder / "model.safetensors").exists()
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for name in ("reward", "reward_std", "rewards/accuracy_reward/mean", "kl", "completions/mean_length"):
        assert name in metrics[-1], name  # TRL's metric names


def test_trls_script_trains_with_trls_command_line(script):
    done = run(script, [sys.executable, *trl_command("out-single")])
    assert_trained(script, "out-single", done)


@pytest.mark.parametrize("accelerate_config", ["zero3", "fsdp2"])
def test_trls_script_under_accelerate_launch_on_two_cpu_processes(script, accelerate_config):
    configs = Path(trl.__file__).parent / "accelerate_configs"
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
              str(configs / f"{accelerate_config}.yaml"), "--num_processes", "2"]  # fmt: skip
    out = f"out-{accelerate_config}"
    assert_trained(script, out, run(script, [*launch, *trl_command(out)]))
    placement = json.loads((script / out / "grpokit_run.json").read_text())
    assert placement["state"] == "finished"


def test_trls_script_says_push_to_hub_cannot_reach_the_hub(script):
    done = run(script, [sys.executable, *trl_command("out-push", "--push_to_hub", "true")])
    assert done.returncode != 0
    assert "push_to_hub:" in done.stderr and "Traceback" in done.stderr  # (TRL's script lets errors through)
    assert not (script / "out-push" / "model.safetensors").exists()  # refused before any training


# ---- grpokit train with TRL's YAML and flags ---------------------------------------------------------------
def test_grpokit_train_runs_a_trl_yaml_with_trls_flag_forms(script, tmp_path):
    config = tmp_path / "grpo.yaml"
    config.write_text(
        f"model_name_or_path: {script / 'model'}\ndataset_name: {script / 'data'}\n"
        "reward_funcs: [accuracy_reward]\n"
        f"output_dir: {tmp_path / 'run'}\nlearning_rate: 1.0e-5\nper_device_train_batch_size: 8\n"
        "num_generations: 4\nmax_completion_length: 6\nmax_steps: 1\nreport_to: none\ndtype: float32\n"
        "attn_implementation: eager\nenv:\n  GRPOKIT_TRL_YAML_ENV: read\n"
    )
    argv = [
        "train",
        "--config",
        str(config),
        "--learning_rate",
        "2e-5",
        "--log_completions",
        "--max_steps",
        "2",
    ]
    assert main(argv) == 0
    assert os.environ.pop("GRPOKIT_TRL_YAML_ENV") == "read"
    recorded = (tmp_path / "run" / "config.yaml").read_text()
    assert "learning_rate: 2.0e-05" in recorded and "log_completions: true" in recorded
    assert "dtype: float32" in recorded and "attn_implementation: eager" in recorded
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2


def test_grpokit_train_refuses_what_it_cannot_honour_field_by_field(script, tmp_path):
    config = tmp_path / "grpo.yaml"
    config.write_text(f"model_name_or_path: {script / 'model'}\ndataset_name: {script / 'data'}\n"
                      "load_in_4bit: true\ndatasets: [{path: a}]\n")  # fmt: skip
    with pytest.raises(SystemExit) as refused:
        main(["train", "--config", str(config)])
    assert "load_in_4bit=True (quantised" in str(refused.value) and "datasets=" in str(refused.value)
    config.write_text(f"model_name_or_path: {script / 'model'}\nhub_model_revision: main\n")
    with pytest.raises(SystemExit, match=r"unknown option.*hub_model_revision"):
        main(["train", "--config", str(config)])


def test_trl_types_every_dict_field_as_json_text_and_so_does_grpokit():
    """HfArgumentParser reads ``dict | str | None`` as text: grpokit's mapping fields take the same form."""
    hints = typing.get_type_hints(GRPOConfig)
    trl_hints = typing.get_type_hints(trl.GRPOConfig)
    for name, kind in trl_hints.items():
        if "dict" in str(kind) and name in hints:
            assert "str" in str(hints[name]), name
