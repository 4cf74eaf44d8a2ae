"""What a CPU run sets for speed: freed blocks reused instead of page-faulted afresh, and grouped-query
attention without copied keys/values (the same numbers as the copying path)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from grpokit import GRPOConfig
from grpokit.parallel.cpu_runtime import (
    FORCE_GQA,
    apply_cpu_runtime,
    attention_without_copies,
    keep_freed_memory,
)

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# Minor page faults of allocating, filling and freeing a 64 MiB tensor 8 times, after two such rounds that
# settle the heap (in a fresh process, so that no earlier test has set the policy).
FAULTS = """
import resource, sys, torch
from grpokit import GRPOConfig
from grpokit.parallel.cpu_runtime import keep_freed_memory
applied = keep_freed_memory(GRPOConfig(cpu_memory_reuse=sys.argv[1] == "on"))
torch.empty(16 * 2**20).fill_(1.0)
torch.empty(16 * 2**20).fill_(1.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(8):
    torch.empty(16 * 2**20).fill_(1.0)
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(setting: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", FAULTS, setting], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not GLIBC, reason="the policy sets glibc's thresholds")
def test_freed_blocks_are_reused_instead_of_page_faulted_again():
    pages = 64 * 2**20 // 4096  # 16,384 pages per 64 MiB block
    applied, faults_on = _faults("on")
    assert applied == "True" and faults_on <= 2 * pages  # at most a block's move: then the same pages
    applied, faults_off = _faults("off")
    # glibc's default maps a 64 MiB block fresh every time (above its 32 MiB dynamic ceiling)
    assert applied == "False" and faults_off >= 8 * pages * 0.95


def test_gqa_without_copies_gives_the_copying_paths_logits_and_gradients(monkeypatch):
    # 4 query heads on 2 key/value heads; a left-padded batch, so the attention has a mask
    config = Qwen2Config(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    ids = torch.randint(0, 97, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, :4] = 0
    mask[2, :7] = 0

    def logits_and_grad(force: str) -> tuple[torch.Tensor, torch.Tensor]:
        monkeypatch.setenv(FORCE_GQA, force)
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=mask).logits
        out[mask.bool()].square().mean().backward()
        return out.detach(), model.model.layers[0].self_attn.k_proj.weight.grad.clone()

    copied, copied_grad = logits_and_grad("0")
    direct, direct_grad = logits_and_grad("1")
    real = mask.bool()
    torch.testing.assert_close(direct[real], copied[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(direct_grad, copied_grad, rtol=1e-4, atol=1e-6)


def test_a_cpu_run_sets_both_and_keeps_what_the_user_set(monkeypatch):
    monkeypatch.delenv(FORCE_GQA, raising=False)
    apply_cpu_runtime(GRPOConfig(cpu_memory_reuse=False), cpu=False)  # accelerators: nothing
    assert FORCE_GQA not in os.environ
    apply_cpu_runtime(GRPOConfig(cpu_memory_reuse=False), cpu=True)
    assert os.environ[FORCE_GQA] == "1"
    monkeypatch.setenv(FORCE_GQA, "0")  # the user's choice stays
    assert attention_without_copies() is False and os.environ[FORCE_GQA] == "0"
    assert keep_freed_memory(GRPOConfig(cpu_memory_reuse=False)) is False
