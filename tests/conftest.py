"""Fixtures every test package uses: one torch thread, a tiny policy saved to disk, a character tokenizer."""

from __future__ import annotations

import os

import pytest
import torch

from grpokit import GRPOConfig
from grpokit.models.tiny import build_char_tokenizer, build_tiny_model
from grpokit.parallel.hardware import MATRIX_UNITS_ENV

# A config that sets no precision computes in bf16 on a CPU with bf16 matrix units (AMX): the suite states
# "none" so that it checks the same numbers on every machine, its worker processes included. The tests of
# that default (tests/train/test_hardware.py) state the answer they need.
os.environ[MATRIX_UNITS_ENV] = "0"


def small_config(tmp_path, **overrides) -> GRPOConfig:
    """A one-step run of 2 prompts x G=4 with short completions in ``tmp_path/run``: what most trainer tests
    start from (override any field)."""
    values = dict(
        output_dir=str(tmp_path / "run"),
        max_steps=1,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=4,
        disable_tqdm=True,
        seed=0,
    )
    return GRPOConfig(**{**values, **overrides})


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny matmuls: one thread is fastest, immune to a busy machine, and gives the same numbers every run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 2-layer Llama-architecture policy (hidden 32) and the character tokenizer, saved with
    ``save_pretrained`` so tests go through the real ``from_pretrained`` path."""
    path = tmp_path_factory.mktemp("tiny-policy")
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(
        tokenizer, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def char_tok():
    """One token per character; ``<answer>``, ``</answer>`` and ``<step>`` one token each."""
    return build_char_tokenizer(tags=("<answer>", "</answer>", "<step>"))
