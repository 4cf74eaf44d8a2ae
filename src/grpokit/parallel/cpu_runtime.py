"""What grpokit sets, for speed, in a process that trains on the CPU: freed memory kept for reuse, and
grouped-query attention without copied keys/values. Both are exact (the same numbers) and process-wide;
accelerators are left alone.

**Freed memory kept for reuse** (``GRPOConfig.cpu_memory_reuse``, on by default).
- torch allocates CPU tensors with the C allocator; on Linux that is glibc's ``malloc``.
- glibc maps each block above its mmap threshold fresh from the kernel and unmaps it when it is freed. The
  threshold starts at 128 KiB and rises as blocks are freed, to at most 32 MiB. glibc also hands the free
  memory at the top of its heap back to the kernel.
- A GRPO step allocates the same large blocks every step: activations, LM-head chunks, and gradients such
  as a tied [V, H] embedding's (113 MB for SmolLM2-135M). Each time, the kernel page-faults and zero-fills
  their pages again, at ~4.5 us per 4 KiB page on the project's 2-core machine (~1.1 s per GiB).
- The SmolLM2 step of ``benchmarks/`` (W3) spent ~0.75 s of its ~7 s update that way (side by side, 2
  rounds).
- On GPUs, PyTorch's caching allocator keeps freed blocks. Here grpokit raises glibc's two thresholds
  (``mallopt``) to ``KEEP_BYTES``: blocks up to that size come from the heap, and up to that much free heap
  is kept, so the next step reuses the same pages.
- The price is resident memory: the process keeps what it freed, up to a step's high-water mark. The
  setting stays after training. Other C libraries (macOS, musl, Windows) are left as they are.

**Grouped-query attention without copies.**
- For a model with fewer key/value heads than query heads, ``transformers``' ``sdpa`` attention copies the
  keys and values once per query head group (``repeat_kv``) unless ``use_gqa_in_sdpa`` says the kernel
  takes them as they are. It says so on CUDA only without a mask, because CUDA's masked GQA falls back to
  the math kernel.
- torch's CPU kernel takes masked GQA directly (``enable_gqa``) and gives the same output. With SmolLM2's
  shapes (64 rows, 9 query heads on 3 key/value heads, 63 keys) one layer's forward and backward took 6 ms
  instead of 15.
- So a CPU run sets ``transformers``' own switch for it, ``TRANSFORMERS_SDPA_FORCE_GQA=1``. A value the
  user set is kept. W3: update -0.25 to -0.6 s, peak RSS -500 MB.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

__all__ = ["FORCE_GQA", "KEEP_BYTES", "apply_cpu_runtime", "attention_without_copies", "keep_freed_memory"]

logger = logging.getLogger(__name__)

KEEP_BYTES = 1 << 30
"""Blocks up to this size are served from the heap, and this much free heap is kept (1 GiB)."""

FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"
"""``transformers``' switch: grouped-query attention through SDPA's ``enable_gqa`` whatever the mask."""

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3


def apply_cpu_runtime(args: object, *, cpu: bool) -> None:
    """Both settings of the module docstring, for a CPU run (nothing on accelerators)."""
    if cpu:
        keep_freed_memory(args)
        attention_without_copies()


def keep_freed_memory(args: object) -> bool:
    """Raise glibc's mmap and trim thresholds to ``KEEP_BYTES`` when ``args.cpu_memory_reuse`` is set; True
    when they were set, False when nothing was changed (turned off, or not glibc)."""
    if not getattr(args, "cpu_memory_reuse", True):
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    applied = bool(libc.mallopt(_M_MMAP_THRESHOLD, KEEP_BYTES)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, KEEP_BYTES)
    )
    if applied:
        logger.info("grpokit: freed CPU memory kept for reuse (cpu_memory_reuse, %d MiB)", KEEP_BYTES >> 20)
    return applied


def attention_without_copies() -> bool:
    """Set ``TRANSFORMERS_SDPA_FORCE_GQA=1`` unless the user set it; True when set here."""
    if FORCE_GQA in os.environ:
        return False
    os.environ[FORCE_GQA] = "1"
    logger.info("grpokit: grouped-query attention without key/value copies on CPU (%s=1)", FORCE_GQA)
    return True
