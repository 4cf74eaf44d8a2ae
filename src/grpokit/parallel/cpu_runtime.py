"""What grpokit sets, for speed and memory, in a process that trains on the CPU: freed memory kept for
reuse, grouped-query attention without copied keys/values, and bounded oneDNN kernel caches. All are exact
(the same numbers) and process-wide; accelerators are left alone.

**Freed memory kept for reuse** (``GRPOConfig.cpu_memory_reuse``, on by default).
- torch allocates CPU tensors with the C allocator; on Linux that is glibc's ``malloc``.
- glibc maps each block above its mmap threshold fresh from the kernel and unmaps it when it is freed. The
  threshold starts at 128 KiB and rises as blocks are freed, to at most 32 MiB. glibc also hands the free
  memory at the top of its heap back to the kernel.
- A GRPO step allocates the same large blocks every step: activations, LM-head chunks, and gradients such
  as a tied [V, H] embedding's (113 MB for SmolLM2-135M). Each time, the kernel page-faults and zero-fills
  their pages again, at ~4.5 us per 4 KiB page (~1.1 s per GiB) on the 2-core VM where this was first
  measured, ~0.9 us (0.24 s per GiB) on the 2-core AVX2 EPYC of docs/performance.md.
- The SmolLM2 step of ``benchmarks/`` (W3) spent ~0.75 s of its ~7 s update that way (side by side, 2
  rounds).
- On GPUs, PyTorch's caching allocator keeps freed blocks. Here grpokit sets glibc's two thresholds
  (``mallopt``): up to ``KEEP_BYTES`` of free heap is kept (trim), and blocks below
  ``GRPOConfig.cpu_memory_reuse_below`` (1 MiB by default; None: ``KEEP_BYTES``) come from the heap, so the
  next step reuses the same pages.
- Larger blocks are mapped fresh and given back when freed. A heap that also held them fragments: the
  update's forward keeps activations of 2-15 MiB per layer between short-lived ones of the same sizes,
  whose holes the next layer's kept blocks do not fit, so the heap grows past what is live. W4 on the
  2-core AVX2 EPYC: peak 6,155 MiB with every block kept, 4,851 with blocks from 1 MiB mapped fresh, for
  a 6% longer step (about 25 GiB of fresh pages per step, at 0.24 s per GiB there); 8 MiB gave back only
  ~200 MiB of the peak. On a 2-core Zen 5 EPYC, whose fresh pages cost about the same (0.28 s per GiB)
  but whose step is 3x faster, W4's step took 13-19% longer than with every block kept, for a 19% lower
  peak (``benchmarks/results/memory-reuse-zen5-2026-12-06.txt``). Where time matters more than the peak,
  or a fresh page costs more, ``cpu_memory_reuse_below=None`` keeps every block.
- The update's backward is where that fragmentation does not arise: every block it allocates is freed by
  its end (the operators' intermediates, the gradients it passes from layer to layer) but the parameters'
  gradients, kept for the optimizer step. With ``GRPOConfig.cpu_memory_reuse_in_backward`` (on by
  default) each micro-batch's backward takes blocks of every size up to ``KEEP_BYTES`` from the heap
  (``blocks_from_heap``), then the threshold is set back and the heap's free pages are handed back to the
  kernel (``malloc_trim``), so the next forward starts from what is live; the update also starts from a
  trimmed heap (``trim_heap``: the pages the sampler and the log-prob passes freed are not left resident
  beside the forward's fresh activations). Measured side by side:
  ``benchmarks/results/backward-heap-zen5-2026-12-07.txt``.
- Within a layer the same holds for the blocks it frees before it returns: the gated MLP's silu(gate) * up
  and its down product's output, an RMSNorm's squares (and in the update its output, which the linears after
  it do not keep), the LM head's chunks of logits. grpokit's layers allocate them inside
  ``grpokit.models.transient.transient_blocks``, where this runtime serves every size from the heap
  (``transient_blocks``; ``GRPOConfig.cpu_memory_reuse_transient``, on by default) without trimming after,
  so the next layer takes the same pages, and the backward after them. ``transformers``' own intermediates
  (rotary positions, the projections' outputs) are still mapped fresh.
- The price is resident memory: the process keeps the small blocks it freed, up to a step's high-water
  mark. The setting stays after training. Other C libraries (macOS, musl, Windows) are left as they are,
  and so is a process running another allocator in glibc's place (jemalloc or tcmalloc through
  ``LD_PRELOAD``), which manages its own reuse.

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

**Bounded oneDNN kernel caches.**
- torch runs bf16 (and other low-precision) matrix products on the CPU through oneDNN, which builds a
  kernel for each shape it meets and keeps it in two caches of 1,024 entries each by default: ideep's
  (``LRU_CACHE_CAPACITY``) and oneDNN's own (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``). fp32 products go to
  the BLAS library and build nothing.
- A GRPO step meets many shapes (completion lengths, episode turns, micro-batches), and each cached kernel
  holds ~1.5 MB: a bf16 Linear(256, 704) forward and backward at 600 row counts grew the process by
  1,067 MiB, against 75 in fp32; with both caches at 16, by 56 MiB, at 256 by 387 MiB, and no slower.
- So a CPU run sets both to ``ONEDNN_CACHE_CAPACITY`` entries (a value the user set is kept). torch reads
  them when it builds its first such kernel, so a process that ran a bf16 product before the trainer
  starts keeps the defaults. The maze recipe under ``bf16=true``, 80 steps: peak RSS 1,238 MiB instead of
  1,603 (fp32: 1,188), the step as fast (docs/performance.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
import platform
from collections.abc import Iterator
from typing import TYPE_CHECKING

from grpokit.models.transient import serve_transient_blocks

if TYPE_CHECKING:
    from grpokit.config import GRPOConfig

__all__ = [
    "FORCE_GQA",
    "KEEP_BYTES",
    "ONEDNN_CACHES",
    "ONEDNN_CACHE_CAPACITY",
    "apply_cpu_runtime",
    "attention_without_copies",
    "blocks_from_heap",
    "bound_onednn_caches",
    "keep_freed_memory",
    "preloaded_allocator",
    "transient_blocks",
    "trim_heap",
]

logger = logging.getLogger(__name__)

KEEP_BYTES = 1 << 30
"""This much free heap is kept (1 GiB); with ``cpu_memory_reuse_below=None``, blocks up to this size are
served from the heap too."""

FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"
"""``transformers``' switch: grouped-query attention through SDPA's ``enable_gqa`` whatever the mask."""

ONEDNN_CACHES = ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")
"""ideep's and oneDNN's kernel-cache capacities (entries; 1,024 each by default; 0 crashes ideep)."""
ONEDNN_CACHE_CAPACITY = 256
"""The capacity a CPU run gives each: a step's recurring shapes stay cached (SmolLM2's 30 layers meet a few
dozen per step; at 64 its bf16 update took ~5% longer than at 1,024, at 256 no longer)."""

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3

_set_threshold: int | None = None
"""The mmap threshold ``keep_freed_memory`` set in this process, where ``blocks_from_heap`` and ``trim_heap``
apply (one below ``KEEP_BYTES``, with ``cpu_memory_reuse_in_backward``); None: they do nothing (accelerators,
other allocators, every block kept already, turned off)."""
_transient_threshold: int | None = None
"""The same, where ``transient_blocks`` applies (``cpu_memory_reuse_transient``); None: it does nothing."""
_heap_depth = 0
"""How many ``blocks_from_heap`` / ``transient_blocks`` are open (the outermost sets the threshold back)."""


def apply_cpu_runtime(args: GRPOConfig, *, cpu: bool) -> None:
    """Both settings of the module docstring, for a CPU run (nothing on accelerators)."""
    if cpu:
        keep_freed_memory(args)
        attention_without_copies()
        bound_onednn_caches()


def keep_freed_memory(args: GRPOConfig) -> bool:
    """When ``args.cpu_memory_reuse`` is set, set glibc's mmap threshold to ``args.cpu_memory_reuse_below``
    (None: ``KEEP_BYTES``) and its trim threshold to ``KEEP_BYTES``; True when they were set, False when
    nothing was changed (turned off, or not glibc)."""
    if not args.cpu_memory_reuse:
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    other = preloaded_allocator()
    if other is not None:
        logger.info("grpokit: %s serves malloc; cpu_memory_reuse (glibc's thresholds) leaves it alone", other)
        return False
    below = args.cpu_memory_reuse_below or KEEP_BYTES
    libc = _libc()
    applied = bool(libc.mallopt(_M_MMAP_THRESHOLD, below))
    applied = applied and bool(libc.mallopt(_M_TRIM_THRESHOLD, KEEP_BYTES))
    if applied:
        logger.info("grpokit: freed CPU blocks below %d KiB kept for reuse (cpu_memory_reuse)", below >> 10)
        global _set_threshold, _transient_threshold
        _set_threshold = below if below < KEEP_BYTES and args.cpu_memory_reuse_in_backward else None
        _transient_threshold = below if below < KEEP_BYTES and args.cpu_memory_reuse_transient else None
        serve_transient_blocks(transient_blocks)
    return applied


@contextlib.contextmanager
def blocks_from_heap() -> Iterator[bool]:
    """Within the block, glibc serves blocks of every size up to ``KEEP_BYTES`` from its heap (for a phase
    that frees what it allocates: the update's backward); after it, the mmap threshold ``keep_freed_memory``
    set is set again and the heap's free pages are handed back (``malloc_trim(0)``). Yields whether it
    applies (``_set_threshold``); where it does not, nothing changes."""
    below = _set_threshold
    if below is None:
        yield False
        return
    try:
        with _every_size_from_heap(below):
            yield True
    finally:
        _libc().malloc_trim(0)


@contextlib.contextmanager
def transient_blocks() -> Iterator[bool]:
    """Within the block, glibc serves blocks of every size up to ``KEEP_BYTES`` from its heap, for code that
    frees them again soon (a layer's intermediates, ``grpokit.models.transient``); after it the threshold
    ``keep_freed_memory`` set is set again, and the freed blocks stay in the heap for the next such block
    (the next layer's), untrimmed. Yields whether it applies (``_transient_threshold``)."""
    below = _transient_threshold
    if below is None:
        yield False
        return
    with _every_size_from_heap(below):
        yield True


@contextlib.contextmanager
def _every_size_from_heap(below: int) -> Iterator[None]:
    """Blocks of every size up to ``KEEP_BYTES`` from the heap within; the mmap threshold ``below`` again when
    the outermost such block ends (a layer's window inside a backward's leaves the backward's as it is)."""
    global _heap_depth
    if _heap_depth == 0:
        _libc().mallopt(_M_MMAP_THRESHOLD, KEEP_BYTES)
    _heap_depth += 1
    try:
        yield
    finally:
        _heap_depth -= 1
        if _heap_depth == 0:
            _libc().mallopt(_M_MMAP_THRESHOLD, below)


def trim_heap() -> bool:
    """Hand the heap's free pages back to the kernel (``malloc_trim(0)``) where ``blocks_from_heap`` applies:
    before the update, whose forward maps its activations fresh and would leave the pages the sampler and the
    log-prob passes freed resident beside them (W4: its peak 200-290 MiB lower). True when trimmed."""
    if _set_threshold is None:
        return False
    _libc().malloc_trim(0)
    return True


def preloaded_allocator() -> str | None:
    """The file name of the library serving ``malloc`` in glibc's place (preloaded: jemalloc, tcmalloc, ...),
    or None where glibc's own ``malloc`` serves it: the process's ``malloc`` symbol against libc's."""
    try:
        libc = _libc()
        served = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value
        own = ctypes.cast(libc.malloc, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None
    if served == own:
        return None
    info = _DlInfo()
    if not getattr(libc, "dladdr", None) or not libc.dladdr(ctypes.c_void_p(served), ctypes.byref(info)):
        return "an allocator in glibc's place"
    return os.path.basename((info.dli_fname or b"?").decode())


@functools.cache
def _libc() -> ctypes.CDLL:
    """glibc, found once per process (``find_library`` runs ``ldconfig -p`` in a subprocess at each call)."""
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


class _DlInfo(ctypes.Structure):
    """``Dl_info`` (dlfcn.h): the shared object holding an address."""

    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def attention_without_copies() -> bool:
    """Set ``TRANSFORMERS_SDPA_FORCE_GQA=1`` unless the user set it; True when set here."""
    if FORCE_GQA in os.environ:
        return False
    os.environ[FORCE_GQA] = "1"
    logger.info("grpokit: grouped-query attention without key/value copies on CPU (%s=1)", FORCE_GQA)
    return True


def bound_onednn_caches() -> list[str]:
    """Set each of ``ONEDNN_CACHES`` to ``ONEDNN_CACHE_CAPACITY`` unless the user set it; the names set."""
    names = [name for name in ONEDNN_CACHES if name not in os.environ]
    for name in names:
        os.environ[name] = str(ONEDNN_CACHE_CAPACITY)
    if names:
        logger.info(
            "grpokit: oneDNN kernel caches bounded to %d entries (%s)",
            ONEDNN_CACHE_CAPACITY,
            ", ".join(names),
        )
    return names
