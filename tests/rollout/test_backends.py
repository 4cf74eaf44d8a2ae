"""``generation_backend="auto"`` (the default): the fast sampler for the architectures its shared-prefix
decode supports, ``model.generate`` otherwise, with one log line saying which."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from grpokit import GRPOConfig
from grpokit.rollout import FastSampler, TransformersBackend, make_backend
from grpokit.rollout import backends as backends_module

SIZES = dict(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48)


def tiny(model_type: str, **extra) -> torch.nn.Module:
    values = dict(SIZES)
    if model_type in ("gpt2",):
        values = dict(vocab_size=64, n_embd=32, n_layer=1, n_head=4)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **values, **extra))


@pytest.fixture(autouse=True)
def _fresh_log_memory(monkeypatch):
    monkeypatch.setattr(backends_module, "_logged", set())


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3", "mistral"])
def test_auto_picks_the_fast_sampler_for_llama_family_models(model_type, caplog):
    extra = {"sliding_window": None} if model_type == "mistral" else {}
    with caplog.at_level(logging.INFO, logger="grpokit.rollout.backends"):
        backend = make_backend("auto", tiny(model_type, **extra))
    assert isinstance(backend, FastSampler) and backend.impl == "native"
    assert f"the fast sampler for this {model_type} model" in caplog.text


@pytest.mark.parametrize("model_type, extra", [("gpt2", {}), ("mistral", {"sliding_window": 16})])
def test_auto_falls_back_to_generate_with_a_log_line(model_type, extra, caplog):
    with caplog.at_level(logging.INFO, logger="grpokit.rollout.backends"):
        first = make_backend("auto", tiny(model_type, **extra))
        make_backend("auto", tiny(model_type, **extra))
    assert isinstance(first, TransformersBackend)
    lines = [r for r in caplog.records if "model.generate for this" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING  # logged once


def test_auto_is_the_default_and_explicit_names_stay():
    assert GRPOConfig().generation_backend == "auto"
    model = tiny("llama")
    assert isinstance(make_backend("transformers", model), TransformersBackend)
    assert isinstance(make_backend("fast", model), FastSampler)
    with pytest.raises(ValueError, match="generation_backend must be one of"):
        make_backend("vllm-ish", model)
