"""Every input a user can get wrong is refused in one line before anything is loaded: ``grpokit train`` with
``model=tiny:arithmetic`` and an empty cold-start cache (``GRPOKIT_CACHE``) must leave the cache empty (the
cold start never ran), ``model=<a directory>`` must never reach ``from_pretrained`` (no weights read), and the
message is one line, never a traceback. The same checks run in Python before ``GRPOTrainer`` loads weights."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.cli import main

ROWS = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(3) for b in range(3)]


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("GRPOKIT_CACHE", str(cache))
    return cache


@pytest.fixture
def no_weights(monkeypatch):
    """Any weight load fails the test: the refusal must come first."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded before the refusal")

    for name in ("AutoModelForCausalLM", "AutoModelForSequenceClassification"):
        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", refuse)


@pytest.fixture
def files(tmp_path):
    no_prompt = tmp_path / "no_prompt.jsonl"
    no_prompt.write_text('{"question": "1+1=", "solution": "2"}\n')
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    both = tmp_path / "data"
    both.mkdir()
    (both / "train.jsonl").write_text('{"prompt": "1+1=", "solution": "2"}\n')
    (both / "train.csv").write_text("prompt,solution\n2+2=,4\n")
    return {"no_prompt": no_prompt, "a_file": a_file, "both": both, "dir": tmp_path}


# (arguments after `train`, the message's start): tiny:arithmetic with an empty cache
CASES = [
    (["reward_funcs=[acuracy]"], "reward_funcs: unknown reward 'acuracy': not a built-in"),
    (["reward_funcs=[no_such_module.reward]"], "reward_funcs: unknown reward 'no_such_module.reward'"),
    (["reward_weights=[1.0,2.0,3.0]"], "GRPOConfig.reward_weights has 3 values but the run has 2 reward"),
    (["use_peft=true", "lora_target_modules=[qq_proj]"], "peft_config.target_modules: 'qq_proj' match no"),
    (["output_dir={a_file}"], "output_dir {a_file} is a file, not a folder"),
    (["output_dir={a_file}/run"], "output_dir {a_file}/run: {a_file} is a file, so no folder can be made"),
    (["task=null", "dataset={no_prompt}", "reward_funcs=[accuracy]"], "dataset row 0: missing the 'prompt'"),
    (["task=null", "dataset={both}", "reward_funcs=[accuracy]"], "dataset: the folder {both} holds train"),
    (["max_completion_length=100000"], "GRPOConfig.max_completion_length=100000: the longest prompt"),
    (["environment_kwargs={{size: 3}}"], "GRPOConfig.environment_kwargs={{'size': 3}} given, but the run"),
    (["task=null", "dataset={no_prompt}", "column_mapping={{question: prompt}}", "reward_funcs=[accuracy]",
      "per_device_train_batch_size=16"], "dataset has 1 row(s) but each step takes 2 distinct prompts"),
    (["model={dir}/missing"], "model: '{dir}/missing' does not exist"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "message"), CASES, ids=[c[1].split(":")[0][:40] for c in CASES])
def test_a_bad_input_is_one_line_before_the_cold_start(tmp_path, empty_cache, files, capsys, extra, message):
    argv = ["train", "model=tiny:arithmetic", f"output_dir={tmp_path / 'run'}", "disable_tqdm=true"]
    argv += [item.format(**files) for item in extra]
    with pytest.raises(SystemExit) as refused:
        main(argv)
    text = str(refused.value)
    assert text.startswith("grpokit: " + message.format(**files)), text
    assert "\n" not in text and "Traceback" not in capsys.readouterr().err
    assert list(empty_cache.iterdir()) == []  # no cold start
    assert not (tmp_path / "run").exists()  # nothing written


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["model="], "model: empty; give a model directory"),
        (["task=arithmetc"], "task: unknown task 'arithmetc'; known tasks: arithmetic, calculator"),
        (["lr_scheduler_kwargs={foo: 1}"], "GRPOConfig.lr_scheduler_kwargs ['foo'] are not arguments of"),
    ],
)
def test_an_option_the_parser_refuses_is_its_message_without_a_traceback(
    tmp_path, empty_cache, capsys, extra, message
):
    with pytest.raises(SystemExit) as refused:
        main(["train", f"output_dir={tmp_path / 'run'}", *extra])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and " ".join(message.split()) in " ".join(err.replace("│", " ").split())
    assert list(empty_cache.iterdir()) == []


def test_a_folder_given_as_the_recipe_is_named(tmp_path, empty_cache):
    with pytest.raises(SystemExit, match=rf"^grpokit: recipe '{tmp_path}' is a directory; give a recipe's"):
        main(["train", str(tmp_path)])
    assert list(empty_cache.iterdir()) == []


def test_a_model_directory_is_refused_before_its_weights_load(tiny_model_dir, tmp_path, no_weights, files):
    base = ["train", f"model={tiny_model_dir}", f"output_dir={tmp_path / 'run'}", "max_steps=1"]
    for extra, message in [
        (["max_completion_length=300"], "GRPOConfig.max_completion_length=300: the longest prompt"),
        (["use_peft=true", "lora_target_modules=[qq_proj]"], "peft_config.target_modules: 'qq_proj'"),
        (["reward_funcs=[acuracy]"], "reward_funcs: unknown reward 'acuracy'"),
    ]:
        with pytest.raises(SystemExit, match="^grpokit: " + message):
            main(base + extra)


def test_in_python_rewards_and_lengths_are_refused_before_the_weights_load(
    tiny_model_dir, tmp_path, no_weights
):
    config = GRPOConfig(output_dir=str(tmp_path / "run"), max_steps=1, num_generations=4,
                        per_device_train_batch_size=8, max_completion_length=4)  # fmt: skip
    with pytest.raises(ValueError, match="unknown reward 'acuracy'"):
        GRPOTrainer(str(tiny_model_dir), ["acuracy"], config, train_dataset=ROWS)
    with pytest.raises(ValueError, match=r"reward_weights has 3 values but there are 1 reward"):
        GRPOTrainer(str(tiny_model_dir), ["think_format"], GRPOConfig(**{**config.to_dict(),
                    "reward_weights": [1.0, 2.0, 3.0]}), train_dataset=ROWS)  # fmt: skip
    long = GRPOConfig(**{**config.to_dict(), "max_completion_length": 1000})
    with pytest.raises(ValueError, match=r"max_completion_length=1000: the longest prompt \(\d+ tokens\)"):
        GRPOTrainer(str(tiny_model_dir), ["think_format"], long, train_dataset=ROWS)


def test_a_tokenizer_with_more_ids_than_the_embedding_is_refused(tiny_model_dir, tmp_path, no_weights):
    from grpokit.models import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_model_dir))
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(100)])
    config = GRPOConfig(output_dir=str(tmp_path / "run"), max_steps=1, num_generations=4,
                        per_device_train_batch_size=8, max_completion_length=4)  # fmt: skip
    message = r"the tokenizer has \d+ token ids but the model's embedding has \d+ rows"
    with pytest.raises(ValueError, match=message):
        GRPOTrainer(
            str(tiny_model_dir), ["think_format"], config, train_dataset=ROWS, processing_class=tokenizer
        )


def test_args_as_a_dict_is_a_config_and_anything_else_is_refused(tiny_model_dir, tmp_path):
    values = {"output_dir": str(tmp_path / "run"), "max_steps": 1, "num_generations": 4,
              "per_device_train_batch_size": 8, "max_completion_length": 4, "disable_tqdm": True}  # fmt: skip
    trainer = GRPOTrainer(str(tiny_model_dir), ["think_format"], values, train_dataset=ROWS)
    assert isinstance(trainer.args, GRPOConfig) and trainer.args.max_completion_length == 4
    with pytest.raises(ValueError, match=r"args: expected a GRPOConfig \(or a dict of its fields\), got"):
        GRPOTrainer(str(tiny_model_dir), ["think_format"], [1], train_dataset=ROWS)


def test_help_into_a_closed_pipe_ends_quietly():
    reader = subprocess.run(
        f"{sys.executable} -m grpokit.cli train --help | head -1", shell=True, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert "usage: grpokit train" in reader.stdout
    assert "Traceback" not in reader.stderr and "BrokenPipe" not in reader.stderr


def test_an_unexpected_error_keeps_its_traceback_and_says_it_is_not_an_input_error(
    tiny_model_dir, tmp_path, capsys, monkeypatch
):
    """An error no input check raised (here: a reward function that crashes) is not dressed as a refusal."""
    (tmp_path / "crashing_rewards.py").write_text("def reward(completions, **kw):\n    return 1 / 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["train", f"model={tiny_model_dir}", f"output_dir={tmp_path / 'run'}", "max_steps=1",
            "reward_funcs=[crashing_rewards.reward]", "evaluate=false", "num_generations=4",
            "per_device_train_batch_size=8", "max_completion_length=4", "disable_tqdm=true"]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "ZeroDivisionError" in err
    assert "is not one of grpokit's input checks" in err
    manifest = json.loads((tmp_path / "run" / "grpokit_run.json").read_text())
    assert manifest["state"] == "failed" and "ZeroDivisionError" in manifest["error"]
