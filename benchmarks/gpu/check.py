"""The real-model path on one GPU, in one short run: the exactness invariants in bf16 on the GPU's kernels,
gradient checkpointing, LoRA with the fast sampler, both generation backends, the reference offload, and a
GRPO run on a Qwen2.5-0.5B-shaped model built locally, its peak memory against the memory plan and its
throughput (tokens/s of generation and of the update).

    bash benchmarks/gpu/prepare.sh          # here, with network: the wheels the GPU machine lacks
    bash benchmarks/gpu/check.sh            # on the GPU machine (no network): installs them, runs this
    python benchmarks/gpu/check.py --device cpu --quick   # the same checks, small, on the CPU (smoke test)

Each check prints PASS/FAIL with its numbers (INFO: measurements with no pass mark); a check that raises is
a FAIL with its traceback, and the next check still runs. Exit status 0 when every check passed, 1
otherwise, 2 without a CUDA device. Nothing is downloaded: the models and tokenizers are built here.

What is checked (the CPU tests behind each: tests/train/test_gradient_checkpointing.py, test_lora.py,
test_reference_memory.py, test_memory_plan.py):

1. Gradient checkpointing equals the plain backward: shared-prefix log-probs and every parameter's gradient,
   float32 and bf16 weights, with and without LoRA (bounds, on log-probs and on gradients relative to their
   largest entry: 1e-5 in float32, 2e-2 in bf16, where the backward's atomics may add in another order).
2. The lr-0 invariants through real GRPOTrainer steps (mu = 2, beta 0.04, micro-batch = one group, two
   micro-batches per step): ratio exactly 1, KL exactly 0, clip fraction exactly 0, in float32, under bf16
   autocast and with bf16 weights, each with and without checkpointing, and the loss and gradient norm the
   same with and without checkpointing (relative 1e-5 in float32, 1e-3 with bf16). Exact because the
   old-policy, reference and training forwards run the same code on the same shapes at the same weights:
   a difference is a different computation, not rounding.
3. LoRA with the fast sampler: after 3 LoRA steps (fast sampler, checkpointing), greedy decoding by the
   fast sampler equals ``model.generate`` token for token (float32).
4. bf16 weights + checkpointing + LoRA train on both backends (finite); the offloaded reference lives on the
   CPU and gives the same KL.
5. A 1-GPU GRPO run on a model of Qwen2.5-0.5B's shape (the config grpokit ships for ``grpokit plan``:
   24 layers, hidden 896, 14/2 heads, vocabulary 151936, tied embeddings; random weights, a local word-level
   tokenizer of 151936 words), saved and loaded through ``from_pretrained``: 16 prompts x G 8 per step,
   prompts of 32 tokens, completions up to 256, fast sampler, micro-batches of 16 rows. Two settings:
   (a) float32 weights, bf16 autocast, bf16 reference (the shipped recipes' precision), no checkpointing;
   (b) bf16 weights, bf16 reference, gradient checkpointing. Each: the steps are finite, peak
   ``torch.cuda.max_memory_allocated`` over the run (from before the model is loaded) against
   ``plan_memory``'s peak for the same config (what ``grpokit plan`` prints), per phase too, and tokens/s.

   Accepted band for measured / planned peak: 0.75 to 1.10. The plan's parts are exact or counted from the
   kernels (tests/train/test_memory_plan.py measures two CPU runs within 10% of it: 1.03 and 1.00), and
   ``max_memory_allocated`` leaves out what the plan leaves out (the CUDA context, the allocator's cached but
   free blocks). The upper edge keeps the CPU test's 10%: a plan that undercounts by more sends runs into
   out-of-memory. The lower edge is wider because CUDA's attention can skip what the plan counts: sdpa with
   no padding mask takes grouped key/value heads as they are (``enable_gqa``), where the plan counts their
   copies repeated to all heads; and completions that end at EOS make the batch shorter than the planned
   ``max_prompt_length + max_completion_length``. The shapes are chosen so that the plan's other upper
   bound does not apply: all prompts are 32 tokens, and the shared-prefix forward (which the plan ignores)
   does not pay at 32 + 256 tokens, so the update runs the plain forward the plan counts.

   Throughput (INFO), from the steps after the first (warm-up): generation = completion tokens / time in
   ``generate``; update = (prompt + completion tokens) of every row / time in ``update`` (forward, backward
   and optimizer step over all micro-batches); the reference pass likewise.

6. Padding-free passes (``padding_free=True``, ``grpokit.models.packing``) equal the padded ones: log-probs
   and every gradient, with and without the shared prefix, float32 (1e-5) and bf16 (2e-2); on CUDA with the
   ``flash-attn`` package a bf16 model runs its variable-length kernel (the check names the kernel it ran).
   INFO: forward+backward tokens/s, padded and packed, on 16 groups of 8 whose completions spread from 64
   to 512 tokens; the fast sampler's tokens/s decoding every row to the end and letting finished rows
   leave (tests/train/test_padding_free.py, tests/rollout/test_compaction.py).

7. Lean layers (``lean_activations``, ``grpokit.models.lean_layers``) against ``transformers``' MLPs and
   norms: the logits bit for bit, every gradient (float32 1e-5; bf16 weights and bf16 autocast 2e-2), fewer
   bytes kept for the backward; INFO: forward+backward tokens/s of both (tests/models/test_lean_layers.py).

``--quick`` makes every model small (the CPU smoke test); on CUDA it then skips the memory band, which a
small model's fixed workspaces would dominate. On an H200 the whole script takes about 2-3 minutes
(estimate: not yet run on a GPU); ``check.sh`` stops it at 8 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import importlib.metadata
import json
import math
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

import grpokit
from grpokit import GRPOConfig, GRPOTrainer
from grpokit.cli.memory_plan import GIB, plan_memory
from grpokit.cli.plan_command import MODEL_CONFIGS_DIR, load_model_config
from grpokit.models import build_char_tokenizer, build_tiny_model
from grpokit.models.policy import enable_gradient_checkpointing
from grpokit.reporting.metrics import PhaseTimer
from grpokit.rollout import FastSampler, SamplingParams, ScriptedBackend
from grpokit.train.forward import completion_logprobs

FAILURES: list[str] = []
PASSED: list[str] = []
ROWS = [{"prompt": f"{a}+{b}+{a}{b}=", "solution": str(a + b)} for a in range(1, 9) for b in range(1, 9)]
# long prompts, short completions: the shared-prefix forward applies (the lr-0 issue's reproduction)
LONG_ROWS = [
    {"prompt": f"{a}{b}+{b}{a}+{a * 7}+{b * 9}+{a + b}=", "solution": str(22 * a + 22 * b)}
    for a in range(1, 9)
    for b in range(1, 9)
]
MEMORY_BAND = (0.75, 1.10)
"""Accepted measured / planned peak on CUDA (see the module docstring for why)."""


def report(name: str, ok: bool, detail: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)
    (PASSED if ok else FAILURES).append(name)


def info(name: str, detail: str) -> None:
    print(f"INFO  {name}: {detail}", flush=True)


def reward(prompts, completions, completion_ids, solution, **kwargs):
    return [(1.0 if s in c else 0.0) + 0.1 * len(c) for c, s in zip(completions, solution)]


def config(out: Path, **overrides) -> GRPOConfig:
    values = dict(
        output_dir=str(out),
        max_steps=1,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=8,
        disable_tqdm=True,
        seed=0,
        bf16=False,  # stated: unset, a CPU with bf16 matrix units would choose bf16 (the checks say when)
    )
    return GRPOConfig(**{**values, **overrides})


def tiny_sizes(quick: bool) -> dict:
    """The small policies' sizes: a few kernels' worth on the CPU; on the GPU wide enough for the real
    kernels (head dimension 64, grouped key/value heads)."""
    if quick:
        return dict(hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=128)
    return dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=704)


def qwen2(device: str, dtype: torch.dtype) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(
        vocab_size=257,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).to(device=device, dtype=dtype).train()


def timed_qwen2(device: str, quick: bool) -> Qwen2ForCausalLM:
    """The Qwen2 the speed measurements time: ``tiny_sizes``, vocabulary 32,000, 1,024 positions; bf16 on
    CUDA, float32 elsewhere."""
    sizes = tiny_sizes(quick)
    cfg = Qwen2Config(
        vocab_size=32000, hidden_size=sizes["hidden_size"], intermediate_size=sizes["intermediate_size"],
        num_hidden_layers=sizes["num_layers"], num_attention_heads=sizes["num_heads"],
        num_key_value_heads=sizes["num_kv_heads"], max_position_embeddings=1024, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return Qwen2ForCausalLM(cfg).to(device=device, dtype=dtype).train()


def batch(device: str, groups: int = 3, group: int = 4, prompt: int = 24, completion: int = 12):
    gen = torch.Generator().manual_seed(0)
    p_ids = torch.randint(3, 257, (groups, prompt), generator=gen).repeat_interleave(group, 0)
    c_ids = torch.randint(3, 257, (groups * group, completion), generator=gen)
    c_mask = torch.ones_like(c_ids)
    c_mask[::3, completion // 2 :] = 0  # ragged completions
    return [t.to(device) for t in (p_ids, torch.ones_like(p_ids), c_ids, c_mask)], group


def grads(model, tensors, group, weights):
    model.zero_grad(set_to_none=True)
    logps, _ = completion_logprobs(model, *tensors, num_generations=group, shared_prefix=True)
    (logps * weights).sum().backward()
    return logps.detach(), {
        n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None
    }


# ---------------------------------------------------------------------------------- 1. checkpointing exact
def check_checkpointing_exact(device: str, tmp: Path, quick: bool) -> None:
    """Shared-prefix forward with and without gradient checkpointing: log-probs and every gradient."""
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        for adapter in (False, True):
            plain = qwen2(device, dtype)
            ckpt = copy.deepcopy(plain)
            enable_gradient_checkpointing(ckpt)
            if adapter:
                lora = LoraConfig(
                    r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
                )
                plain, ckpt = get_peft_model(plain, lora), get_peft_model(ckpt, copy.deepcopy(lora))
                ckpt.load_state_dict(plain.state_dict())
            tensors, group = batch(device)
            weights = torch.randn(tensors[2].shape, device=device)
            lp_a, g_a = grads(plain, tensors, group, weights)
            lp_b, g_b = grads(ckpt, tensors, group, weights)
            lp_diff = float((lp_a - lp_b).abs().max())
            g_diff = max(
                float((g_a[k] - g_b[k]).abs().max() / g_a[k].abs().max().clamp(min=1e-6)) for k in g_a
            )
            name = f"checkpointing exact ({str(dtype)[6:]}, {'lora' if adapter else 'full'})"
            report(
                name,
                lp_diff <= tol and g_diff <= tol and set(g_a) == set(g_b),
                f"logp {lp_diff:.1e}, grad {g_diff:.1e} (bound {tol:.0e})",
            )


# --------------------------------------------------------------------------------------- 2. lr-0 invariants
def check_trainer_lr0(device: str, tmp: Path, quick: bool) -> None:
    """The issue's reproduction: shared prefix, mu 2, beta 0.04, lr 0: ratio 1, KL 0, no clipping, in three
    precisions, with and without checkpointing; checkpointing changes neither the loss nor the grad norm."""
    tok = build_char_tokenizer()
    precisions = {
        "fp32": ({}, None, 1e-5),
        "bf16 autocast": ({"bf16": True}, None, 1e-3),
        "bf16 weights": ({"bf16": True}, torch.bfloat16, 1e-3),
    }
    for label, (precision, weights_dtype, rel) in precisions.items():
        last = {}
        for checkpointing in (False, True):
            policy = build_tiny_model(tok, arch="qwen2", **tiny_sizes(quick))
            if weights_dtype is not None:
                policy = policy.to(weights_dtype)
            args = config(
                tmp / f"lr0-{label}-{checkpointing}".replace(" ", "-"),
                per_device_train_batch_size=4,  # one group per micro-batch: the shared-prefix forward
                gradient_accumulation_steps=2,
                num_iterations=2,
                beta=0.04,
                learning_rate=0.0,
                gradient_checkpointing=checkpointing,
                **precision,
            )
            trainer = GRPOTrainer(
                policy,
                [reward],
                args,
                train_dataset=LONG_ROWS,
                processing_class=tok,
                rollout_backend=ScriptedBackend(tok, lambda p, i: ["3", "31", "310", "42+"][i % 4]),
            )
            m = trainer.train()[-1]
            clip = max(m[f"clip_ratio/{k}_mean"] for k in ("low", "high", "region"))
            ok = m["ratio_mean"] == 1.0 and m["kl"] == 0.0 and clip == 0.0
            report(
                f"trainer lr 0 ({label}, checkpointing {'on' if checkpointing else 'off'})",
                ok,
                f"ratio - 1 = {m['ratio_mean'] - 1:.1e}, kl {m['kl']:.1e}, clip fraction {clip:.1e} "
                "(all must be exactly 0)",
            )
            last[checkpointing] = m
        d_loss = abs(last[True]["loss"] - last[False]["loss"]) / max(abs(last[False]["loss"]), 1e-9)
        d_norm = abs(last[True]["grad_norm"] - last[False]["grad_norm"]) / max(
            last[False]["grad_norm"], 1e-12
        )
        report(
            f"trainer checkpointing == plain ({label})",
            d_loss <= rel and d_norm <= rel,
            f"loss {last[False]['loss']:.6g} vs {last[True]['loss']:.6g} (rel {d_loss:.1e}), grad norm "
            f"{last[False]['grad_norm']:.6g} vs {last[True]['grad_norm']:.6g} (rel {d_norm:.1e}; "
            f"bound {rel:.0e})",
        )


# ---------------------------------------------------------------------------------- 3. LoRA + fast sampler
def check_lora_fast_sampler(device: str, tmp: Path, quick: bool) -> None:
    """LoRA policy after 3 steps at lr 0.05 (fast sampler, checkpointing): greedy fast sampler equals
    model.generate token for token (fp32 weights)."""
    tok = build_char_tokenizer()
    lora = LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    policy = build_tiny_model(tok, arch="qwen2", **tiny_sizes(quick))
    args = config(
        tmp / "lora",
        max_steps=3,
        learning_rate=0.05,
        beta=0.04,
        generation_backend="fast",
        gradient_checkpointing=True,
    )
    trainer = GRPOTrainer(policy, [reward], args, train_dataset=ROWS, processing_class=tok, peft_config=lora)
    trainer.train()
    model = trainer.unwrapped_model.eval()
    prompts = [tok(r["prompt"], add_special_tokens=False)["input_ids"] for r in ROWS[:8]]
    params = SamplingParams(max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_ids=())
    sampler = FastSampler(model, impl="native")
    fast = sampler.generate(prompts, 1, params).completion_ids
    same = 0
    for ids, got in zip(prompts, fast):
        x = torch.tensor([ids], device=trainer.accelerator.device)
        with torch.no_grad():
            out = model.generate(
                input_ids=x,
                attention_mask=torch.ones_like(x),
                do_sample=False,
                max_new_tokens=12,
                eos_token_id=None,
                pad_token_id=0,
            )
        same += out[0, len(ids) :].tolist() == got
    report(
        "lora fast sampler == generate",
        same == len(prompts),
        f"{same}/{len(prompts)} prompts identical (greedy, 12 tokens, {sampler.impl} decode, "
        f"{trainer.accelerator.device})",
    )


# ------------------------------------------------------------------------------ 4. bf16 backends, offload
def check_backends_bf16(device: str, tmp: Path, quick: bool) -> None:
    """bf16 weights + checkpointing + LoRA on both backends; the reference offloaded (full weights)."""
    tok = build_char_tokenizer()
    for backend in ("transformers", "fast"):
        policy = build_tiny_model(tok, arch="qwen2", **tiny_sizes(quick)).to(torch.bfloat16)
        lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
        args = config(
            tmp / f"bf16-{backend}",
            max_steps=2,
            generation_backend=backend,
            gradient_checkpointing=True,
            num_iterations=2,
            beta=0.04,
            learning_rate=1e-3,
        )
        trainer = GRPOTrainer(
            policy, [reward], args, train_dataset=ROWS, processing_class=tok, peft_config=lora
        )
        last = trainer.train()[-1]
        finite = all(math.isfinite(last[k]) for k in ("loss", "kl", "grad_norm"))
        report(
            f"bf16 + checkpointing + lora, {backend}", finite, f"loss {last['loss']:.4f} kl {last['kl']:.2e}"
        )


def check_reference_offload(device: str, tmp: Path, quick: bool) -> None:
    tok = build_char_tokenizer()
    policy = build_tiny_model(tok, arch="qwen2", **tiny_sizes(quick))
    kl, where = {}, set()
    for offload in (False, True):
        args = config(tmp / f"offload-{offload}", beta=0.04, ref_model_offload=offload, learning_rate=0.0)
        trainer = GRPOTrainer(
            copy.deepcopy(policy),
            [reward],
            args,
            train_dataset=ROWS,
            processing_class=tok,
            rollout_backend=ScriptedBackend(tok, lambda p, i: ["3", "31", "310", "42+"][i % 4]),
        )
        kl[offload] = trainer.train()[-1]["kl"]
        where = {p.device.type for p in trainer.reference.model.parameters()}
    report("reference offload", where == {"cpu"} and kl[True] == kl[False], f"ref on {where}, kl {kl}")


# ----------------------------------------------------------------------- 5. a 0.5B-shaped run vs the plan
class PhasePeaks:
    """Peak ``torch.cuda.max_memory_allocated`` over ``base``, overall and per trainer phase (the phases of
    ``PhaseTimer``, nested ones included): the peak counter is read and reset at every phase boundary."""

    def __init__(self, base: int) -> None:
        self.base, self.overall = base, 0
        self.open: list[str] = []
        self.peaks: dict[str, int] = defaultdict(int)

    def fold(self) -> None:
        peak = torch.cuda.max_memory_allocated() - self.base
        self.overall = max(self.overall, peak)
        for name in self.open:
            self.peaks[name] = max(self.peaks[name], peak)
        torch.cuda.reset_peak_memory_stats()

    @contextlib.contextmanager
    def watching(self):
        """Count the phases of every PhaseTimer while inside (the class's method, restored after)."""
        original = PhaseTimer.phase

        @contextlib.contextmanager
        def phase(timer, name):
            self.fold()
            self.open.append(name)
            try:
                with original(timer, name):
                    yield
            finally:
                self.fold()
                self.open.remove(name)

        PhaseTimer.phase = phase
        try:
            yield self
        finally:
            PhaseTimer.phase = original
            self.fold()


def word_tokenizer(vocab_size: int):
    """A word-level tokenizer of exactly ``vocab_size`` tokens, built locally (as benchmarks/tiny_model.py):
    <pad> 0, <eos> 1, <unk> 2, then the words w0, w1, ...; a prompt of n words is n tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    vocab.update({f"w{i}": i + 3 for i in range(vocab_size - 3)})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tok.padding_side = "left"
    return tok


def build_half_billion(out: Path, device: str, quick: bool) -> tuple[Path, int]:
    """Qwen2.5-0.5B's shape (the config shipped for ``grpokit plan``), random weights, a local tokenizer of
    its vocabulary size; saved to ``out``. ``quick``: the same architecture, small."""
    cfg = load_model_config("Qwen/Qwen2.5-0.5B")
    if quick:
        small = dict(hidden_size=112, intermediate_size=256, num_hidden_layers=2, num_attention_heads=14)
        small |= dict(
            num_key_value_heads=2, vocab_size=2048, max_position_embeddings=512, max_window_layers=2
        )
        values = json.loads((MODEL_CONFIGS_DIR / "Qwen--Qwen2.5-0.5B.json").read_text())
        values |= {**small, "bos_token_id": None, "eos_token_id": 1}
        cfg = AutoConfig.for_model(values.pop("model_type"), **values)
    cfg.pad_token_id, cfg.eos_token_id, cfg.bos_token_id = 0, 1, None
    tok = word_tokenizer(cfg.vocab_size)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, 1
    model.generation_config.bos_token_id = None
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    count = sum(p.numel() for p in model.parameters())
    del model
    return out, count


def check_half_billion_run(device: str, tmp: Path, quick: bool) -> None:
    cuda = device == "cuda"
    started = time.perf_counter()
    model_dir, count = build_half_billion(tmp / "qwen2.5-0.5b-shaped", device, quick)
    info(
        "0.5B-shaped model",
        f"{count / 1e6:.1f} M parameters built and saved in {time.perf_counter() - started:.1f} s",
    )
    prompt_len, completion_len, group, prompts = (16, 32, 4, 4) if quick else (32, 256, 8, 16)
    rows_per_step = prompts * group
    micro = 2 * group
    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    gen = torch.Generator().manual_seed(0)
    words = torch.randint(0, vocab - 3, (64, prompt_len), generator=gen).tolist()
    rows = [{"prompt": " ".join(f"w{w}" for w in ws)} for ws in words]

    def varied(prompts, completions, completion_ids, **kwargs):  # rewards that differ within a group
        return [float(sum(int(t) for t in ids[:4]) % 5) for ids in completion_ids]

    settings = {
        "a: fp32 weights, bf16 autocast, bf16 reference": dict(bf16=True, ref_model_dtype="bfloat16"),
        "b: bf16 weights and reference, checkpointing": dict(
            bf16=True, model_init_kwargs={"dtype": "bfloat16"}, gradient_checkpointing=True
        ),
    }
    for label, extra in settings.items():
        args = GRPOConfig(
            output_dir=str(tmp / f"run-{label[0]}"),
            max_steps=2 if quick else 4,
            num_generations=group,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=rows_per_step // micro,
            max_prompt_length=prompt_len,
            max_completion_length=completion_len,
            learning_rate=1e-6,
            beta=0.04,
            generation_backend="fast",
            disable_tqdm=True,
            seed=0,
            **extra,
        )
        name = f"0.5B run ({label})"
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() if cuda else 0
        peaks = PhasePeaks(base)
        with peaks.watching() if cuda else contextlib.nullcontext():
            trainer = GRPOTrainer(str(model_dir), [varied], args, train_dataset=rows)
            history = trainer.train()
        last = history[-1]
        finite = all(
            math.isfinite(m[k]) for m in history for k in ("loss", "kl", "grad_norm", "reward_std")
        ) and all(m.get("nonfinite_steps", 0) == 0 for m in history)
        report(
            f"{name}: trains",
            finite and len(history) == args.max_steps,
            f"{len(history)} steps, loss {last['loss']:.4g}, kl {last['kl']:.2e}, grad norm "
            f"{last['grad_norm']:.3g}, completions {last['completions/mean_length']:.1f} tokens on average",
        )
        timed = history[1:] or history  # the first step warms up (allocations, kernel choice)

        def mean(key, timed=timed):
            return sum(m.get(key, 0.0) for m in timed) / len(timed)

        completion_tokens = rows_per_step * mean("completions/mean_length")
        row_tokens = rows_per_step * prompt_len + completion_tokens
        gen_s, update_s, ref_s = (mean(f"time/{k}") for k in ("generate", "update", "reference"))
        info(
            f"{name}: tokens/s",
            f"generation {completion_tokens / gen_s:,.0f} ({completion_tokens:,.0f} completion tokens in "
            f"{gen_s:.2f} s), update {row_tokens / update_s:,.0f} ({row_tokens:,.0f} prompt + completion "
            f"tokens, {args.gradient_accumulation_steps} micro-batches of {micro} rows, in {update_s:.2f} s),"
            f" reference pass {row_tokens / max(ref_s, 1e-9):,.0f}; step {mean('time/step'):.2f} s "
            f"(mean of steps 2-{len(history)})",
        )
        if cuda and not quick:
            plan = plan_memory(load_model_config(str(model_dir)), args)
            ratio = peaks.overall / plan.peak
            measured = {
                "generation": peaks.peaks.get("generate", 0),
                "logprobs": max(peaks.peaks.get("reference", 0), peaks.peaks.get("old_logprobs", 0)),
                "update": peaks.peaks.get("update", 0),
            }
            per_phase = ", ".join(
                f"{phase} {measured.get(phase, 0) / GIB:.2f}/{planned / GIB:.2f}"
                for phase, planned in plan.phases.items()
            )
            ok = MEMORY_BAND[0] <= ratio <= MEMORY_BAND[1]
            report(
                f"{name}: peak memory vs grpokit plan",
                ok,
                f"measured {peaks.overall / GIB:.2f} GiB, planned {plan.peak / GIB:.2f} GiB, "
                f"ratio {ratio:.3f} (accepted {MEMORY_BAND[0]}-{MEMORY_BAND[1]}); "
                f"per phase measured/planned GiB: {per_phase}",
            )
            if not ok:
                print(plan.table(), flush=True)
        else:  # a small model's peak is mostly fixed workspaces (cuBLAS, attention), not planned
            why = "needs CUDA" if not cuda else "--quick (the 0.5B shape only)"
            print(f"SKIP  {name}: peak memory vs grpokit plan: {why}", flush=True)
        del trainer, history


# ---------------------------------------------------------------------------------- 6. padding-free passes
def check_padding_free(device: str, tmp: Path, quick: bool) -> None:
    """Packed passes (``padding_free=True``: flash-attn's variable-length kernel where it is installed and the
    model is half precision, else SDPA over one padded batch on CUDA, per run of equal rows elsewhere)
    against the padded ones, with and without the shared prefix: log-probs and every gradient; then
    forward+backward tokens/s of both on a batch whose completions spread from 1/8 to the whole length, and
    the fast sampler's decode with and without compaction."""
    from grpokit.models.packing import _flash_varlen_usable

    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        for shared in (False, True):
            model = qwen2(device, dtype)
            tensors, group = batch(device)
            weights = torch.randn(tensors[2].shape, device=device)
            results = []
            for packed in (False, True):
                model.zero_grad(set_to_none=True)
                logps, _ = completion_logprobs(
                    model, *tensors, num_generations=group, shared_prefix=shared, padding_free=packed
                )
                (logps * weights).sum().backward()
                results.append(
                    (logps.detach(), {n: p.grad.float().clone() for n, p in model.named_parameters()})
                )
            (lp_a, g_a), (lp_b, g_b) = results
            lp_diff = float((lp_a - lp_b).abs().max())
            g_diff = max(
                float((g_a[k] - g_b[k]).abs().max() / g_a[k].abs().max().clamp(min=1e-6)) for k in g_a
            )
            kernel = "SDPA per run of rows" if device != "cuda" else "SDPA, one padded batch"
            if _flash_varlen_usable(lp_a.new_zeros(1, dtype=dtype)):
                kernel = "flash-attn varlen"
            name = f"padding-free equals padded ({str(dtype)[6:]}, shared prefix {shared}, {kernel})"
            report(
                name,
                lp_diff <= tol and g_diff <= tol,
                f"logp {lp_diff:.1e}, grad {g_diff:.1e} (bound {tol:.0e})",
            )
    # speed: 16 groups of 8, prompts of 128 tokens, completions of 64..512 tokens
    model = timed_qwen2(device, quick)
    groups, group, prompt, longest = (2, 4, 32, 64) if quick else (16, 8, 128, 512)
    gen = torch.Generator().manual_seed(1)
    p_ids = torch.randint(3, 32000, (groups, prompt), generator=gen).repeat_interleave(group, 0)
    c_ids = torch.randint(3, 32000, (groups * group, longest), generator=gen)
    lengths = torch.randint(longest // 8, longest + 1, (groups * group,), generator=gen)
    c_mask = (torch.arange(longest)[None, :] < lengths[:, None]).long()
    tensors = [t.to(device) for t in (p_ids, torch.ones_like(p_ids), c_ids, c_mask)]
    real = int(c_mask.sum())
    seconds = {}
    for packed in (False, True, False, True):  # the second of each is timed
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        sync()
        begin = time.perf_counter()
        logps, _ = completion_logprobs(model, *tensors, num_generations=group, padding_free=packed)
        logps.sum().backward()
        sync()
        seconds[packed] = time.perf_counter() - begin
        model.zero_grad(set_to_none=True)
    info(
        "padding-free forward+backward",
        f"{real} real completion tokens of {c_mask.numel()}: padded {real / seconds[False]:.0f} tokens/s, "
        f"packed {real / seconds[True]:.0f} tokens/s ({seconds[False] / seconds[True]:.2f}x)",
    )
    sampler_rates = {}
    params = SamplingParams(max_new_tokens=longest, eos_token_ids=tuple(range(3, 3 + 500)), temperature=1.0)
    prompts = p_ids[::group].tolist()
    model.eval()
    for compact in (False, True, False, True):
        sampler = FastSampler(model, compact=compact, generator=torch.Generator(device).manual_seed(0))
        begin = time.perf_counter()
        out = sampler.generate(prompts, group, params)
        if device == "cuda":
            torch.cuda.synchronize()
        tokens = sum(len(c) for c in out.completion_ids)
        sampler_rates[compact] = tokens / (time.perf_counter() - begin)
    info(
        "compacting sampler",
        f"decode every row {sampler_rates[False]:.0f} tokens/s, finished rows leave "
        f"{sampler_rates[True]:.0f} tokens/s ({sampler_rates[True] / sampler_rates[False]:.2f}x)",
    )


# ---------------------------------------------------------------------------------------- 7. lean layers
def check_lean_layers(device: str, tmp: Path, quick: bool) -> None:
    """The lean MLPs and norms (``lean_activations``) against ``transformers``' on the device's kernels: the
    logits bit for bit, every gradient (1e-5 in float32; 2e-2 in bf16 and under bf16 autocast, where the
    residual stream's gradient adds its terms in another order), and fewer bytes kept for the backward;
    then forward+backward tokens/s of both."""
    from grpokit.models.lean_layers import use_lean_layers

    def saved_and_grads(model, ids, autocast):
        weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        seen: dict[int, int] = {}

        def pack(t):
            if t.untyped_storage().data_ptr() not in weights:
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        model.zero_grad(set_to_none=True)
        hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        with hooks, torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=ids).logits
        logits.float().square().mean().backward()
        grads = {n: p.grad.float().clone() for n, p in model.named_parameters()}
        return logits.detach(), grads, sum(seen.values())

    ids = torch.randint(3, 257, (4, 48), generator=torch.Generator().manual_seed(2)).to(device)
    for label, dtype, autocast, tol in (
        ("float32", torch.float32, False, 1e-5),
        ("bfloat16", torch.bfloat16, False, 2e-2),
        ("bf16 autocast", torch.float32, True, 2e-2),
    ):
        plain = qwen2(device, dtype)
        lean = copy.deepcopy(plain)
        use_lean_layers(lean)
        lg_a, g_a, saved_a = saved_and_grads(plain, ids, autocast)
        lg_b, g_b, saved_b = saved_and_grads(lean, ids, autocast)
        g_diff = max(float((g_a[k] - g_b[k]).abs().max() / g_a[k].abs().max().clamp(min=1e-6)) for k in g_a)
        report(
            f"lean layers equal transformers' ({label})",
            torch.equal(lg_a, lg_b) and g_diff <= tol and saved_b < saved_a,
            f"logits equal {torch.equal(lg_a, lg_b)}, grad {g_diff:.1e} (bound {tol:.0e}), "
            f"saved for the backward {saved_b / saved_a:.2f}x",
        )
    # speed: a Qwen2 of tiny_sizes, 8 rows of 512 tokens, bf16 on CUDA
    plain = timed_qwen2(device, quick)
    lean = copy.deepcopy(plain)
    use_lean_layers(lean)
    rows, length = (2, 64) if quick else (8, 512)
    ids = torch.randint(3, 32000, (rows, length), generator=torch.Generator().manual_seed(3)).to(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    seconds = {}
    for name, model in (("transformers", plain), ("lean", lean), ("transformers", plain), ("lean", lean)):
        sync()
        begin = time.perf_counter()
        model(input_ids=ids).logits.float().mean().backward()
        sync()
        seconds[name] = time.perf_counter() - begin  # the second of each is kept
        model.zero_grad(set_to_none=True)
    info(
        "lean layers forward+backward",
        f"{rows * length} tokens: transformers {rows * length / seconds['transformers']:.0f} tokens/s, lean "
        f"{rows * length / seconds['lean']:.0f} tokens/s ({seconds['transformers'] / seconds['lean']:.2f}x)",
    )


CHECKS: list[Callable[[str, Path, bool], None]] = [
    check_checkpointing_exact,
    check_trainer_lr0,
    check_lora_fast_sampler,
    check_backends_bf16,
    check_reference_offload,
    check_half_billion_run,
    check_padding_free,
    check_lean_layers,
]


def environment(device: str) -> None:
    versions = {
        name: importlib.metadata.version(name) for name in ("torch", "transformers", "accelerate", "peft")
    }
    where = f"grpokit {grpokit.__version__} from {Path(grpokit.__file__).parent}"
    print(f"python {sys.version.split()[0]}; {', '.join(f'{k} {v}' for k, v in versions.items())}; {where}")
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        print(
            f"device: {props.name}, {props.total_memory / GIB:.1f} GiB, "
            f"capability {props.major}.{props.minor}, CUDA {torch.version.cuda}, "
            f"bf16 supported: {torch.cuda.is_bf16_supported()}",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="small models everywhere (CPU smoke test)")
    parser.add_argument("--only", default="", help="comma-separated check names (e.g. half_billion_run)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu/check.py: no CUDA device; run with --device cpu for the CPU smoke test")
        return 2
    environment(args.device)
    started = time.perf_counter()
    wanted = {f"check_{n.strip()}" for n in args.only.split(",") if n.strip()}
    with tempfile.TemporaryDirectory() as tmp:
        for check in CHECKS:
            if wanted and check.__name__ not in wanted:
                continue
            begin = time.perf_counter()
            try:
                check(args.device, Path(tmp), args.quick)
            except Exception as err:
                traceback.print_exc()
                report(check.__name__, False, f"raised {type(err).__name__}: {err}")
            print(f"      ({check.__name__}: {time.perf_counter() - begin:.0f} s)", flush=True)
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
    elapsed = time.perf_counter() - started
    print(f"\nsummary: {len(PASSED)} passed, {len(FAILURES)} failed; {elapsed:.0f} s")
    for name in FAILURES:
        print(f"  FAILED  {name}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
