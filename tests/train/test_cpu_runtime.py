"""What a CPU run sets for speed and memory: freed blocks reused instead of page-faulted afresh, grouped-query
attention without copied keys/values (the same numbers as the copying path), bounded oneDNN kernel caches."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.parallel import cpu_runtime
from grpokit.parallel.cpu_runtime import (
    FORCE_GQA,
    ONEDNN_CACHE_CAPACITY,
    apply_cpu_runtime,
    attention_without_copies,
    keep_freed_memory,
    preloaded_allocator,
)

from ..conftest import small_config

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
SETS_GLIBC_THRESHOLDS = pytest.mark.skipif(
    not GLIBC or preloaded_allocator() is not None, reason="the policy sets glibc's thresholds"
)

# Minor page faults of allocating, filling and freeing a block of argv[2] floats 8 times, after two such
# rounds that settle the heap (in a fresh process, so that no earlier test has set the policy). argv[1]:
# "off" (cpu_memory_reuse=False), "all" (cpu_memory_reuse_below=None) or "default".
FAULTS = """
import resource, sys, torch
from grpokit import GRPOConfig
from grpokit.parallel.cpu_runtime import keep_freed_memory
settings = {"off": dict(cpu_memory_reuse=False), "all": dict(cpu_memory_reuse_below=None), "default": {}}
applied = keep_freed_memory(GRPOConfig(**settings[sys.argv[1]]))
numel = int(sys.argv[2])
torch.empty(numel).fill_(1.0)
torch.empty(numel).fill_(1.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(8):
    torch.empty(numel).fill_(1.0)
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(setting: str, nbytes: int) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", FAULTS, setting, str(nbytes // 4)], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1])


@SETS_GLIBC_THRESHOLDS
def test_freed_blocks_are_reused_instead_of_page_faulted_again():
    block = 64 * 2**20
    pages = block // 4096  # 16,384 pages per 64 MiB block
    applied, faults_all = _faults("all", block)
    assert applied == "True" and faults_all <= 2 * pages  # at most a block's move: then the same pages
    applied, faults_off = _faults("off", block)
    # glibc's default maps a 64 MiB block fresh every time (above its 32 MiB dynamic ceiling)
    assert applied == "False" and faults_off >= 8 * pages * 0.95


@SETS_GLIBC_THRESHOLDS
def test_by_default_blocks_from_1_mib_are_mapped_fresh_and_smaller_ones_reused():
    applied, faults_large = _faults("default", 2**20)  # a 1 MiB block: mapped, given back, mapped again
    assert applied == "True" and faults_large >= 8 * 256 * 0.95
    small = 2**20 - 4096  # just below: from the heap, the same pages every time
    applied, faults_small = _faults("default", small)
    assert applied == "True" and faults_small <= 2 * small // 4096


# Inside blocks_from_heap (after keep_freed_memory at GRPOConfig's defaults, argv[1] "on"/"off": its
# cpu_memory_reuse_in_backward): whether it applies, minor page faults of 8 rounds of a 64 MiB block inside
# it, of a 256 MiB block outside it after (larger than all the heap it grew, at most three 64 MiB blocks:
# malloc serves a request that fits a free heap chunk from the heap whatever the threshold), and the resident
# memory it handed back when it ended.
IN_HEAP = """
import resource, sys, torch
from grpokit import GRPOConfig
from grpokit.parallel.cpu_runtime import blocks_from_heap, keep_freed_memory
keep_freed_memory(GRPOConfig(cpu_memory_reuse_in_backward=sys.argv[1] == "on"))
numel = 64 * 2**20 // 4
def faults(numel):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(8):
        torch.empty(numel).fill_(1.0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
with blocks_from_heap() as applies:
    torch.empty(numel).fill_(1.0)
    inside = faults(numel)
    during = resident()
after = resident()
print(applies, inside, faults(4 * numel), during - after)
"""


def _printed(script: str, *args: str) -> list[str]:
    """What ``script`` prints, run with ``args`` in a fresh process (no earlier test's policy set)."""
    run = [sys.executable, "-c", script, *args]
    return subprocess.run(run, capture_output=True, text=True, check=True).stdout.split()


@SETS_GLIBC_THRESHOLDS
def test_blocks_from_heap_reuses_every_block_inside_and_hands_the_free_pages_back_after():
    pages = 64 * 2**20 // 4096
    applies, inside, outside, handed_back = _printed(IN_HEAP, "on")
    assert applies == "True"
    assert int(inside) <= 2 * pages  # at most a block's move: then the same heap pages every round
    assert int(outside) >= 8 * 4 * pages * 0.95  # after it: from 1 MiB mapped fresh again
    assert int(handed_back) >= 60 * 2**20  # the freed block's pages trimmed from the heap
    applies, inside, outside, _ = _printed(IN_HEAP, "off")
    assert applies == "False" and int(inside) >= 8 * pages * 0.95  # cpu_memory_reuse_in_backward=False


# Inside grpokit.models.transient.transient_blocks (the seam the layers call), after keep_freed_memory at
# GRPOConfig's defaults (argv[1] "on"/"off": its cpu_memory_reuse_transient): whether it applies, minor page
# faults of 8 rounds of a 4 MiB block inside it; then, inside blocks_from_heap, of 8 rounds of a 64 MiB block
# after a transient window opened and closed within it (the backward's window must stay open), and of 8
# rounds of a 256 MiB block after both (larger than all the heap grew: mapped fresh again).
TRANSIENT = """
import resource, sys, torch
from grpokit import GRPOConfig
from grpokit.models.transient import transient_blocks
from grpokit.parallel.cpu_runtime import blocks_from_heap, keep_freed_memory
keep_freed_memory(GRPOConfig(cpu_memory_reuse_transient=sys.argv[1] == "on"))
def faults(numel):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(8):
        torch.empty(numel).fill_(1.0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
with transient_blocks() as applies:
    torch.empty(2**20).fill_(1.0)
    inside = faults(2**20)
with blocks_from_heap():
    with transient_blocks():
        pass
    torch.empty(2**24).fill_(1.0)
    nested = faults(2**24)
print(applies, inside, nested, faults(2**26))
"""


@SETS_GLIBC_THRESHOLDS
def test_transient_blocks_come_from_the_heap_and_leave_an_enclosing_window_open():
    pages = 4 * 2**20 // 4096
    applies, inside, nested, after = _printed(TRANSIENT, "on")
    assert applies == "True" and int(inside) <= 2 * pages  # the same heap pages every round
    assert int(nested) <= 2 * 16 * pages  # the backward's window still served the 64 MiB blocks
    assert int(after) >= 8 * 64 * pages * 0.95  # after both: from 1 MiB mapped fresh again
    applies, inside, _, _ = _printed(TRANSIENT, "off")
    assert applies == "False" and int(inside) >= 8 * pages * 0.95  # cpu_memory_reuse_transient=False


# trim_heap after 200 blocks of 512 KiB (below the 1 MiB threshold: from the heap) were filled and freed,
# with cpu_memory_reuse_in_backward argv[1] "on"/"off": whether it trimmed, the resident bytes handed back.
TRIM = """
import sys, torch
from grpokit import GRPOConfig
from grpokit.parallel.cpu_runtime import keep_freed_memory, trim_heap
keep_freed_memory(GRPOConfig(cpu_memory_reuse_in_backward=sys.argv[1] == "on"))
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
blocks = [torch.empty(2**17).fill_(1.0) for _ in range(200)]
del blocks
before = resident()
print(trim_heap(), before - resident())
"""


@SETS_GLIBC_THRESHOLDS
def test_trim_heap_hands_the_freed_small_blocks_pages_back():
    trimmed, handed_back = _printed(TRIM, "on")
    assert trimmed == "True" and int(handed_back) >= 90 * 2**20  # of the 100 MiB freed (kept: under 1 GiB)
    trimmed, handed_back = _printed(TRIM, "off")
    assert trimmed == "False" and abs(int(handed_back)) < 10 * 2**20


def test_each_micro_batch_backward_runs_with_blocks_from_the_heap(tiny_model_dir, tmp_path, monkeypatch):
    """Each micro-batch's backward (accelerate's) runs inside ``blocks_from_heap``, the optimizer step outside
    it."""
    import grpokit.train.update as update

    inside, entered = [False], []
    real = update.blocks_from_heap

    @contextlib.contextmanager
    def recording():
        with real() as applies:
            entered.append(applies)
            inside[0] = True
            yield applies
            inside[0] = False

    monkeypatch.setattr(update, "blocks_from_heap", recording)
    config = small_config(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=2, beta=0.0)
    rows = [{"prompt": f"{k}+1="} for k in range(4)]
    trainer = GRPOTrainer(str(tiny_model_dir), [_length], config, train_dataset=rows)
    context, seen = trainer.update_context, []
    backward, step = context.backward, context.step

    def recorded_backward(loss):
        seen.append(("backward", inside[0]))
        backward(loss)

    def recorded_step(max_norm):
        seen.append(("step", inside[0]))
        return step(max_norm)

    monkeypatch.setattr(context, "backward", recorded_backward)
    monkeypatch.setattr(context, "step", recorded_step)
    trainer.train()
    assert seen == [("backward", True), ("backward", True), ("step", False)]
    glibc_policy = GLIBC and preloaded_allocator() is None
    assert entered == [glibc_policy] * 2  # applies on a CPU run under glibc (cpu_memory_reuse's defaults)
    if glibc_policy:
        assert cpu_runtime._set_threshold == 2**20


def _length(completions, **kwargs):
    return [float(len(c)) for c in completions]


JEMALLOC = next(
    (f"/usr/lib/{arch}-linux-gnu/libjemalloc.so.2" for arch in ("x86_64", "aarch64")
     if os.path.exists(f"/usr/lib/{arch}-linux-gnu/libjemalloc.so.2")),
    None,
)  # fmt: skip


PRELOADED = """
from grpokit import GRPOConfig
from grpokit.parallel.cpu_runtime import keep_freed_memory, preloaded_allocator
print(preloaded_allocator(), keep_freed_memory(GRPOConfig()))
"""


@pytest.mark.skipif(not GLIBC or JEMALLOC is None, reason="needs glibc and jemalloc (apt: libjemalloc2)")
def test_a_preloaded_allocator_is_left_to_its_own_reuse():
    env = dict(os.environ, LD_PRELOAD=JEMALLOC)
    run = [sys.executable, "-c", PRELOADED]
    out = subprocess.run(run, capture_output=True, text=True, check=True, env=env).stdout.split()
    assert out == ["libjemalloc.so.2", "False"]  # glibc's thresholds not set: jemalloc serves malloc
    env.pop("LD_PRELOAD")
    out = subprocess.run(run, capture_output=True, text=True, check=True, env=env).stdout.split()
    assert out == ["None", "True"]


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


# RSS growth of bf16 products (forward and backward) at ``shapes`` row counts (600 for the test), in a
# fresh process (torch reads the cache capacities when it builds its first oneDNN kernel), with the caches
# bounded first or left at their defaults; and a digest of the outputs, which must not depend on the caching.
KERNEL_CACHES = """
import sys, torch
from grpokit.parallel.cpu_runtime import bound_onednn_caches
if sys.argv[1] == "bounded":
    bound_onednn_caches()
torch.manual_seed(0)
torch.set_num_threads(1)
layer = torch.nn.Linear(256, 704)
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) / 1024
start, digest = rss(), 0.0
for rows in range(400, 400 + int(sys.argv[2])):
    x = (torch.ones(rows, 256) / rows).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    y.float().square().sum().backward()  # three kernels per shape: forward, input and weight gradients
    digest += y.float().sum().item() + x.grad.sum().item()
print(rss() - start, digest)
"""


def _kernel_cache_growth(setting: str, shapes: int = 600) -> tuple[float, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("CACHE_CAPACITY")}
    out = subprocess.run(
        [sys.executable, "-c", KERNEL_CACHES, setting, str(shapes)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.split()
    return float(out[0]), out[1]


@pytest.mark.skipif(platform.system() != "Linux", reason="reads /proc/self/status")
def test_bounded_onednn_caches_keep_bf16_products_from_growing_the_process():
    # A probe first: where bf16 products cache little per shape (e.g. AMD EPYC without AMX: ~20 MiB once,
    # at the first kernels, ~0 per shape after, 27-31 MiB over the 600) the test would skip after minutes
    # of emulated bf16. The growth from 10 to 150 shapes is per-shape caching alone; the test needs 200 MiB
    # over 600 shapes (0.33 MiB a shape, 47 over 140), so under 20 there is nothing to bound.
    per_shape = _kernel_cache_growth("default", shapes=150)[0] - _kernel_cache_growth("default", shapes=10)[0]
    if per_shape < 20:
        pytest.skip(f"this processor's bf16 products cache little per shape ({per_shape:.0f} MiB, 10 -> 150)")
    default_growth, default_digest = _kernel_cache_growth("default")
    bounded_growth, bounded_digest = _kernel_cache_growth("bounded")
    assert bounded_digest == default_digest  # the same numbers
    if default_growth < 200:
        pytest.skip(f"this processor's bf16 products cache little per shape ({default_growth:.0f} MiB)")
    assert bounded_growth < 0.75 * default_growth


def test_a_cpu_run_bounds_the_onednn_caches_and_keeps_what_the_user_set(monkeypatch):
    monkeypatch.delenv("LRU_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "1024")
    apply_cpu_runtime(GRPOConfig(cpu_memory_reuse=False), cpu=True)
    assert os.environ["LRU_CACHE_CAPACITY"] == str(ONEDNN_CACHE_CAPACITY)
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "1024"  # the user's
    monkeypatch.delenv("LRU_CACHE_CAPACITY")
    apply_cpu_runtime(GRPOConfig(cpu_memory_reuse=False), cpu=False)  # accelerators: left alone
    assert "LRU_CACHE_CAPACITY" not in os.environ
