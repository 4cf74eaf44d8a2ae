"""The CPU allocator policy: freed blocks are reused by the next step instead of page-faulted afresh."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from grpokit import GRPOConfig
from grpokit.train.cpu_memory import keep_freed_memory

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# Minor page faults of allocating, filling and freeing a 64 MiB tensor 8 times, after two such rounds that
# settle the heap (in a fresh process, so that no earlier test has set the policy).
FAULTS = """
import resource, sys, torch
from grpokit import GRPOConfig
from grpokit.train.cpu_memory import keep_freed_memory
applied = keep_freed_memory(GRPOConfig(cpu_memory_reuse=sys.argv[1] == "on"), cpu=True)
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


def test_nothing_is_changed_off_cpu_or_when_turned_off():
    assert keep_freed_memory(GRPOConfig(), cpu=False) is False  # GPUs have their own caching allocator
    assert keep_freed_memory(GRPOConfig(cpu_memory_reuse=False), cpu=True) is False
