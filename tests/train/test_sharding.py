"""How FSDP and DeepSpeed ZeRO are requested (config, command line, ``accelerate launch``), and what is
refused. Training under them on two CPU processes is held to the invariants of test_placement_matrix.py."""

from __future__ import annotations

import json

import pytest
import torch


def test_fsdp_is_requested_by_config_or_accelerate_launch(monkeypatch, caplog):
    from grpokit import GRPOConfig
    from grpokit.parallel.fsdp import fsdp_requested

    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    assert not fsdp_requested(GRPOConfig(), 2)
    assert fsdp_requested(GRPOConfig(fsdp="full_shard auto_wrap"), 2)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch` with fsdp.yaml sets
    assert fsdp_requested(GRPOConfig(), 2)
    assert not fsdp_requested(GRPOConfig(), 1)
    assert "single process has nothing to shard" in caplog.text
    with pytest.raises(ValueError, match=r"GRPOConfig.fsdp options \['offload'\]"):
        GRPOConfig(fsdp="full_shard offload")


def test_a_second_sharding_and_a_deepspeed_optimizer_are_refused():
    from grpokit import GRPOConfig
    from grpokit.parallel.distributed import placement

    with pytest.raises(ValueError, match="choose one way to shard"):
        placement(GRPOConfig(fsdp="full_shard", deepspeed={"zero_optimization": {"stage": 2}}), 2)
    with pytest.raises(ValueError, match="remove the 'optimizer' section"):
        from grpokit.parallel.zero import deepspeed_config

        deepspeed_config(GRPOConfig(deepspeed={"optimizer": {"type": "Adam"}}))


def test_deepspeed_is_requested_by_config_or_accelerate_launch(monkeypatch, tmp_path):
    """What ``accelerate launch --config_file recipes/accelerate/deepspeed_zero2.yaml`` sets selects ZeRO,
    with the stage read from it; a DeepSpeed JSON file works as ``deepspeed``; ZeRO on one process is
    refused."""
    from grpokit import GRPOConfig
    from grpokit.parallel.distributed import placement
    from grpokit.parallel.zero import deepspeed_config

    for name in ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP", "ACCELERATE_DEEPSPEED_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert placement(GRPOConfig(), 2) == "ddp"
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "cpu")
    args = GRPOConfig(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=4)
    assert placement(args, 2) == "zero"
    config = deepspeed_config(args)
    assert config["zero_optimization"] == {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    assert (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]) == (4, 2)
    assert config["gradient_clipping"] == 1.0 and "bf16" not in config and "optimizer" not in config
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    assert placement(args, 2) == "zero" and deepspeed_config(args)["zero_optimization"]["stage"] == 3
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    file = tmp_path / "ds.json"
    file.write_text(json.dumps({"train_batch_size": "auto", "zero_optimization": {"stage": 1}}))
    assert placement(GRPOConfig(deepspeed=str(file)), 2) == "zero"
    assert "train_batch_size" not in deepspeed_config(GRPOConfig(deepspeed=str(file)))
    with pytest.raises(ValueError, match="one process"):
        placement(GRPOConfig(deepspeed=str(file)), 1)
    with pytest.raises(ValueError, match="nor a DeepSpeed JSON file"):
        placement(GRPOConfig(deepspeed=str(tmp_path / "missing.json")), 2)


def test_deepspeed_from_the_command_line():
    from grpokit.cli.recipes import parse_train_args
    from grpokit.parallel.zero import deepspeed_config

    args = parse_train_args(["arithmetic-tiny", "deepspeed=zero2"]).config
    assert deepspeed_config(args)["zero_optimization"] == {"stage": 2}
    with pytest.raises(ValueError, match="neither zero1, zero2, zero3 nor a DeepSpeed JSON file"):
        deepspeed_config(parse_train_args(["arithmetic-tiny", "deepspeed=zero5"]).config)


def test_fp16_under_deepspeed_is_refused_with_the_reason(tiny_model_dir):
    """fp16 needs loss scaling, which grpokit does not wire into the engine: refused before any engine is
    built (bf16 is the mixed precision ZeRO runs under)."""
    from transformers import AutoModelForCausalLM

    from grpokit import GRPOConfig
    from grpokit.parallel.zero import ZeroEngine

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(ValueError, match=r"fp16 is not supported with DeepSpeed ZeRO.*use bf16=true"):
        ZeroEngine(model, model, optimizer, GRPOConfig(deepspeed="zero2", fp16=True, use_cpu=True))
