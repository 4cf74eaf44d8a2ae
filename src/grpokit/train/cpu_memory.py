"""How freed CPU memory is kept: for reuse by the next step, instead of handed back to the kernel.

torch allocates CPU tensors with the C allocator; on Linux that is glibc's ``malloc``. glibc maps each block
above its mmap threshold (128 KiB, raised as blocks are freed, at most 32 MiB) fresh from the kernel and
unmaps it when it is freed, and it hands the free memory at the top of its heap back as well. A GRPO step
allocates the same large blocks every step: activations, LM-head chunks, and gradients such as a tied
[V, H] embedding's (113 MB for SmolLM2-135M). Each time, the kernel page-faults and zero-fills those pages
again. On the project's 2-core machine that cost ~4.5 us per 4 KiB page, about 0.25 s per GiB. The SmolLM2
GRPO step of ``benchmarks/`` (W3) spent ~0.75 s of its 7.4 s update doing it (measured side by side, 2
rounds).

On GPUs, PyTorch's caching allocator keeps freed blocks for reuse. On CPU, with
``GRPOConfig.cpu_memory_reuse`` (the default), grpokit sets glibc's two thresholds (``mallopt``) so that
blocks up to ``KEEP_BYTES`` come from the heap and up to ``KEEP_BYTES`` of free heap is kept. The next step
then reuses the same pages.

The price is resident memory: the process keeps what it freed, up to the high-water mark of a step. On the
benchmarks that was +1-3% of peak RSS on W3 and +10% on the tiny W1. The setting is process-wide and stays
after training. Elsewhere (macOS, musl, Windows) nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

__all__ = ["KEEP_BYTES", "keep_freed_memory"]

logger = logging.getLogger(__name__)

KEEP_BYTES = 1 << 30
"""Blocks up to this size are served from the heap, and this much free heap is kept (1 GiB)."""

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3


def keep_freed_memory(args: object, *, cpu: bool) -> bool:
    """Apply the policy of the module docstring for a CPU run with ``cpu_memory_reuse`` set; True when
    glibc's thresholds were set, False when nothing was changed (off, not a CPU run, or not glibc)."""
    if not cpu or not getattr(args, "cpu_memory_reuse", True):
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
