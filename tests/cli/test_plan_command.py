"""``grpokit plan``: the table, the warning with its numbers, the model configs it reads, bad input named."""

from __future__ import annotations

import re

import pytest
from transformers import AutoModelForCausalLM

from grpokit.cli import main, parse_train_args
from grpokit.cli.memory_plan import GIB
from grpokit.cli.plan_command import describe_plan, load_model_config, plan_train_args
from grpokit.models import build_char_tokenizer, build_tiny_model
from grpokit.models.shape import count_parameters
from grpokit.tasks import ColdStartSettings


def run_plan(capsys, *argv: str) -> str:
    assert main(["plan", *argv]) == 0
    return capsys.readouterr().out


def test_a_7b_recipe_that_does_not_fit_gets_a_warning_with_the_numbers(capsys):
    out = run_plan(capsys, "deepseekmath-rl-7b", "num_processes=8", "strategy=ddp")
    assert "ddp over 8 processes" in out and "weights float32" in out
    # 6,910,365,696 float32 weights = 25.74 GiB on every process under DDP
    assert re.search(r"^  weights +25\.74 ", out, re.MULTILINE)
    # the generation KV cache, one prompt per call: (1024 + 64 x 1024) tokens x (k, v) x 30 layers x 32
    # heads x 128 x 2 B (bf16 autocast)
    assert re.search(r"^  kv_cache +30\.47 ", out, re.MULTILINE)
    warning = re.search(
        r"grpokit: WARNING: the plan needs ([\d.]+) GiB per device, more than the declared 80 GiB", out
    )
    assert warning and float(warning.group(1)) > 80
    assert "optimizer 51.49" in out  # the biggest parts are named: AdamW's 2 x 4 B x 6.9 B


def test_strategy_and_device_memory_from_the_command_line(capsys):
    out = run_plan(capsys, "r1-zero", "--num_processes", "8", "--strategy=fsdp", "device_memory_gb=1000")
    assert "fsdp over 8 processes" in out and "WARNING" not in out
    assert "fits in 1000 GiB per device" in out
    # the recipe's own fsdp option picks the strategy when none is given
    assert "fsdp over 8 processes" in run_plan(capsys, "r1-zero", "num_processes=8", "fsdp=full_shard")


def test_recipe_overrides_change_the_plan(capsys):
    bf16 = run_plan(
        capsys, "r1-zero", "num_processes=8", "strategy=ddp", "model_init_kwargs={dtype: bfloat16}"
    )
    assert re.search(r"^  weights +14\.19 ", bf16, re.MULTILINE)  # 7,615,616,512 x 2 bytes


def test_a_recipe_that_fits(capsys):
    out = run_plan(capsys, "arithmetic-tiny")
    assert "llama" in out and "fits in 80 GiB per device" in out


@pytest.mark.parametrize(
    "argv, field",
    [
        (["num_processes=0"], "num_processes"),
        (["num_processes=two"], "num_processes"),
        (["strategy=zero4"], "strategy"),
        (["device_memory_gb=-1"], "device_memory_gb"),
        (["model=nobody/no-such-model"], "model"),
        (["model=tiny:no-such-task"], "model"),
        (["num_processes=3", "generation_batch_size=128"], "generation_batch_size"),  # not 3 x 128
    ],
)
def test_bad_input_is_named(argv, field, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "arithmetic-tiny", *argv])
    assert field in str(exit_info.value)


def test_help(capsys):
    assert main(["plan", "--help"]) == 0
    assert "num_processes" in capsys.readouterr().out


def test_tiny_model_config_is_the_cold_start_models():
    settings = ColdStartSettings()
    model = build_tiny_model(
        build_char_tokenizer(),
        arch=settings.arch,
        hidden_size=settings.hidden_size,
        num_layers=settings.num_layers,
        num_heads=settings.num_heads,
        intermediate_size=settings.intermediate_size,
    )
    config = load_model_config("tiny:arithmetic")
    assert count_parameters(config) == sum(p.numel() for p in model.parameters())
    assert config.vocab_size == model.config.vocab_size and config.tie_word_embeddings


def test_local_directory_and_shipped_configs(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert count_parameters(load_model_config(str(tiny_model_dir))) == sum(
        p.numel() for p in model.parameters()
    )
    assert load_model_config("Qwen/Qwen2.5-0.5B").num_hidden_layers == 24
    with pytest.raises(ValueError, match="pass a local directory"):
        load_model_config("nobody/no-such-model")


def test_lora_recipes_plan_the_adapters():
    args = parse_train_args(["arithmetic-tiny", "use_peft=true", "lora_r=8"])
    plan = plan_train_args(args)
    # tiny policy: hidden 128, MLP 512, 2 layers; r * (in + out): q/k/v/o 8*(128+128), MLP 8*(128+512)
    assert plan.lora and plan.trainable_parameters == 2 * (4 * 8 * 256 + 3 * 8 * 640)
    assert plan.reference == 0


def test_describe_plan_for_grpokit_train():
    args = parse_train_args(["deepseekmath-rl-7b"])
    text = describe_plan(args, num_processes=8, device_memory_gb=40)
    assert text.startswith("memory plan: llama") and "WARNING: the plan needs" in text
    assert "WARNING" not in describe_plan(args, num_processes=8, device_memory_gb=10_000)
    unknown = parse_train_args(["arithmetic-tiny", "model=nobody/no-such-model"])
    assert describe_plan(unknown, 1).startswith("grpokit: no memory plan: model: no config")
    assert 40 < plan_train_args(args, 8).peak / GIB < 80


def test_a_colocated_vllm_engine_is_planned_from_the_device_memory(capsys):
    out = run_plan(capsys, "arithmetic-tiny", "use_vllm=true", "device_memory_gb=40")
    assert re.search(r"^  vllm_engine +12\.00 ", out, re.MULTILINE)  # 0.3 x 40 GiB
    assert re.search(r"^  logprobs ", out, re.MULTILINE)  # the correction's pi_old pass
