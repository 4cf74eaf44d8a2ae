"""FSDP (``fsdp="full_shard"``) on two CPU processes (gloo): the weights after two steps equal those of one
process training on the same global batch (without gradient checkpointing: with it on the sharded side, the
numbers must not move either; the reference is sharded too and reset to the policy after every step),
generation runs from the gathered weights, the saved model is whole, and a resumed sharded run (weights,
optimizer, reference, RNG) ends where the uninterrupted one does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from ._fsdp_worker import main as run_worker
from .test_multiprocess import run_two_processes

WORKER = Path(__file__).with_name("_fsdp_worker.py")


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


def assert_same_weights(a: Path, b: Path) -> None:
    first, second = weights(a), weights(b)
    assert set(first) == set(second)
    for name, value in first.items():
        torch.testing.assert_close(second[name], value, atol=2e-6, rtol=1e-5, msg=name)


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


def test_two_sharded_processes_train_lora_like_one(tiny_model_dir, tmp_path, one_process_lora):
    """LoRA under FSDP: the adapters (frozen base and trainable adapters in one unit) after two steps equal
    the one-process run's, and greedy generation with the adapters from gathered weights agrees."""
    run_two_processes(WORKER, str(tiny_model_dir), str(tmp_path), "2", "lora")
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
    from grpokit.train.sharding import fsdp_requested

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
