"""Sharded training on two CPU processes (gloo).

FSDP (``fsdp="full_shard"``): the weights after two steps equal those of one process training on the same
global batch (also with gradient checkpointing on the sharded side, and with the reference, sharded too,
reset to the policy after every step); generation runs from the gathered weights; the saved model is
whole; a resumed sharded run (weights, optimizer, reference, RNG) ends where the uninterrupted one does.
DeepSpeed ZeRO-2 and ZeRO-3: the same, without and with a resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from ._sharded_worker import main as run_worker
from .test_multiprocess import run_two_processes

WORKER = Path(__file__).with_name("_sharded_worker.py")


@pytest.fixture(scope="module")
def one_process(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp-one")
    run_worker(str(tiny_model_dir), str(out), "1")
    return out


@pytest.fixture(scope="module")
def one_process_lora(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp-one-lora")
    run_worker(str(tiny_model_dir), str(out), "1", "lora")
    return out


def weights(path: Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(path).state_dict()


def assert_same_weights(a: Path, b: Path, atol: float = 5e-5) -> None:
    """Equal up to float rounding. The runs move every weight by ~1.7e-2 on average (lr 1e-2, two AdamW
    steps); a placement that lost or double-counted gradients would differ by that much. What differs
    legitimately is the order of float sums (gradients all-reduced, or accumulated over micro-batches), and
    AdamW's normalised step g / sqrt(v) turns a rounding difference in a near-zero gradient into a visible
    one: the one-process run itself with 2 micro-batches of 8 rows instead of 1 of 16 differs by up to 6e-6
    (measured), ZeRO-2 by up to 1.2e-5, in a handful of elements. So: no element beyond ``atol`` (1/200 of
    the learning rate) and a mean difference below 1e-7 (1/170,000 of the mean move)."""
    first, second = weights(a), weights(b)
    assert set(first) == set(second)
    for name, value in first.items():
        torch.testing.assert_close(second[name], value, atol=atol, rtol=0, msg=name)
    difference = torch.cat([(first[k] - second[k]).flatten() for k in first]).abs()
    assert float(difference.mean()) < 1e-7


@pytest.mark.parametrize("option", ["checkpointing", "resume"])
def test_two_sharded_processes_train_like_one(tiny_model_dir, tmp_path, one_process, option):
    run_two_processes(WORKER, str(tiny_model_dir), str(tmp_path), "2", option)
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in (0, 1)]
    single = json.loads((one_process / "rank0.json").read_text())
    assert [r["sharded"] for r in ranks] == [True, True] and not single["sharded"]
    assert all(r["step"] == 2 for r in ranks)
    # the model differs from the start (learning rate 1e-2), and equals the one-process run
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    end = weights(tmp_path)
    assert max((end[k] - v).abs().max() for k, v in start.items()) > 1e-3
    assert_same_weights(tmp_path, one_process)
    assert_same_weights(tmp_path / "checkpoint-2", one_process)
    # greedy generation from the gathered weights equals the one-process model's
    assert ranks[0]["greedy"] == ranks[1]["greedy"] == single["greedy"]


@pytest.mark.parametrize("option", ["lora", "lora-resume"])
def test_two_sharded_processes_train_lora_like_one(tiny_model_dir, tmp_path, one_process_lora, option):
    """LoRA under FSDP: the adapters (frozen base and trainable adapters in one unit) after two steps, also
    after a resume, equal the one-process run's; greedy generation with the adapters from gathered weights
    agrees."""
    run_two_processes(WORKER, str(tiny_model_dir), str(tmp_path), "2", option)
    sharded, single = (
        load_file(str(tmp_path / "adapter_model.safetensors")),
        load_file(str(one_process_lora / "adapter_model.safetensors")),
    )
    assert set(sharded) == set(single) and len(single) == 12  # 2 layers x 3 targets x (A, B)
    assert max(v.abs().max() for k, v in single.items() if "lora_B" in k) > 1e-3  # trained from zero
    for name, value in single.items():
        torch.testing.assert_close(sharded[name], value, atol=2e-6, rtol=1e-5, msg=name)
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in (0, 1)]
    assert (
        ranks[0]["greedy"]
        == ranks[1]["greedy"]
        == json.loads((one_process_lora / "rank0.json").read_text())["greedy"]
    )


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


def test_bf16_mixed_precision_gathers_bf16_and_keeps_float32_master_weights(tiny_model_dir, tmp_path):
    """``bf16=true`` under FSDP: units are gathered in bf16 for compute and generation, the shards (AdamW's
    master weights) stay float32 and train. (Not compared with one process: autocast rounds elsewhere, and
    AdamW's normalised steps turn those roundings into visible differences after two steps.)"""
    run_two_processes(WORKER, str(tiny_model_dir), str(tmp_path), "2", "bf16")
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in (0, 1)]
    assert all(r["sharded"] and r["compute_dtype"] == "torch.bfloat16" for r in ranks)
    assert ranks[0]["greedy"] == ranks[1]["greedy"]
    start, end = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict(), weights(tmp_path)
    assert {v.dtype for v in end.values()} == {torch.float32}
    assert max((end[k] - v).abs().max() for k, v in start.items()) > 1e-3


@pytest.mark.parametrize("option", ["zero2", "zero2-resume", "zero3", "zero3-resume"])
def test_deepspeed_zero_on_two_processes_trains_like_one(tiny_model_dir, tmp_path, one_process, option):
    """DeepSpeed ZeRO-2 (AdamW state and gradients partitioned) and ZeRO-3 (the weights too, the reference
    partitioned and reset every step, generation from a refreshed full copy), two micro-batches per
    optimizer step through the engine's accumulation: the weights after two steps, also after a resume from
    the engine's partitioned state, and greedy generation equal the one-process run's."""
    run_two_processes(WORKER, str(tiny_model_dir), str(tmp_path), "2", option)
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in (0, 1)]
    assert [r["strategy"] for r in ranks] == ["zero", "zero"] and all(r["step"] == 2 for r in ranks)
    # two micro-batches of 4 rows instead of one of 16 round differently (see assert_same_weights)
    assert_same_weights(tmp_path, one_process)
    assert (tmp_path / "checkpoint-2" / "deepspeed").is_dir()
    assert (
        ranks[0]["greedy"]
        == ranks[1]["greedy"]
        == json.loads((one_process / "rank0.json").read_text())["greedy"]
    )


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
