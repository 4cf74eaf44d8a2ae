"""Blocks that a layer allocates and frees again before it returns (its short-lived intermediates): the seam
through which a process's CPU runtime serves them from its heap.

A CPU run maps every block from ``GRPOConfig.cpu_memory_reuse_below`` (1 MiB) fresh from the kernel and
gives it back when it is freed, so that the update's kept activations cannot fragment the heap
(``grpokit.parallel.cpu_runtime``). A block that is freed before the next kept one is allocated leaves no
hole: served from the heap, the next layer's block of the same size takes the same pages instead of
page-faulting fresh ones. grpokit's own layers allocate such blocks inside ``transient_blocks()``: the
gated MLP's silu(gate) * up and its down product's output, an RMSNorm's squares (and, in the update, its
output, which the linears after it do not keep), the LM head's chunks of logits.

Models may not import the runtime (``grpokit.parallel``), so the runtime plugs its window in here
(``serve_transient_blocks``); where none is plugged in, or it does not apply, nothing changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

__all__ = ["serve_transient_blocks", "transient_blocks"]

_window: Callable[[], AbstractContextManager] = contextlib.nullcontext


def transient_blocks() -> AbstractContextManager:
    """A block of code whose allocations are freed soon after it (a layer's intermediates): what the runtime
    plugged in does with them (a CPU run under glibc: every size from the heap), else nothing."""
    return _window()


def serve_transient_blocks(window: Callable[[], AbstractContextManager]) -> None:
    """Plug in the context manager ``transient_blocks`` enters (``grpokit.parallel.cpu_runtime`` does)."""
    global _window
    _window = window
