"""The real-model path on one GPU, in one short run: bf16, gradient checkpointing, LoRA, both generation
backends, the reference offload, and peak memory against the memory plan.

    bash benchmarks/gpu/check.sh            # on a machine with one CUDA GPU (about 1-2 minutes)
    python benchmarks/gpu/check.py --device cpu --quick   # the same checks on the CPU (a smoke test)

Each check prints PASS/FAIL with its numbers; the exit status is the number of failed checks. The exactness
checks are the CPU tests' (tests/train/test_gradient_checkpointing.py, test_lora.py,
test_reference_memory.py) on the GPU's kernels: in float32 they must hold to float tolerance; in bf16 the
bounds are bf16's (stated per check).
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.cli.memory_plan import plan_memory
from grpokit.models import build_char_tokenizer, build_tiny_model
from grpokit.models.policy import enable_gradient_checkpointing
from grpokit.rollout import FastSampler, SamplingParams, ScriptedBackend
from grpokit.train.forward import completion_logprobs

FAILURES: list[str] = []
ROWS = [{"prompt": f"{a}+{b}+{a}{b}=", "solution": str(a + b)} for a in range(1, 9) for b in range(1, 9)]


def report(name: str, ok: bool, detail: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)
    if not ok:
        FAILURES.append(name)


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
    )
    return GRPOConfig(**{**values, **overrides})


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


def check_checkpointing_exact(device: str) -> None:
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
                f"logp {lp_diff:.1e}, grad {g_diff:.1e}",
            )


def check_trainer_lr0(device: str, tmp: Path) -> None:
    """The issue's reproduction: shared prefix, mu 2, beta 0.04, lr 0, checkpointing: ratio 1 and KL 0."""
    tok = build_char_tokenizer()
    for precision, tol in (({}, 1e-6), ({"bf16": True}, 2e-3)):
        policy = build_tiny_model(tok, hidden_size=64, num_layers=4, num_heads=4, intermediate_size=128)
        args = config(
            tmp / f"lr0-{bool(precision)}",
            per_device_train_batch_size=4,
            gradient_accumulation_steps=2,
            num_iterations=2,
            beta=0.04,
            learning_rate=0.0,
            gradient_checkpointing=True,
            **precision,
        )
        trainer = GRPOTrainer(
            policy,
            [reward],
            args,
            train_dataset=ROWS,
            processing_class=tok,
            rollout_backend=ScriptedBackend(tok, lambda p, i: ["3", "31", "310", "42+"][i % 4]),
        )
        last = trainer.train()[-1]
        ok = abs(last["ratio_mean"] - 1) <= tol and abs(last["kl"]) <= tol
        report(
            f"trainer lr 0 ({'bf16' if precision else 'fp32'})",
            ok,
            f"ratio {last['ratio_mean']:.7f} kl {last['kl']:.2e}",
        )


def check_lora_fast_sampler(device: str, tmp: Path) -> None:
    """LoRA policy after 3 steps at lr 0.05 (fast sampler, bf16 autocast, checkpointing): greedy fast sampler
    equals model.generate token for token (fp32 weights)."""
    tok = build_char_tokenizer()
    lora = LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    policy = build_tiny_model(tok, hidden_size=64, num_layers=4, num_heads=4, intermediate_size=128)
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
    fast = FastSampler(model, impl="native").generate(prompts, 1, params).completion_ids
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
    report("lora fast sampler == generate", same == len(prompts), f"{same}/{len(prompts)} prompts identical")


def check_backends_bf16(device: str, tmp: Path) -> None:
    """bf16 weights + checkpointing + LoRA on both backends; the reference offloaded (full weights)."""
    tok = build_char_tokenizer()
    for backend in ("transformers", "fast"):
        policy = build_tiny_model(tok, hidden_size=64, num_layers=4, num_heads=4, intermediate_size=128)
        policy = policy.to(torch.bfloat16)
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
        finite = all(torch.isfinite(torch.tensor(last[k])) for k in ("loss", "kl", "grad_norm"))
        report(
            f"bf16 + checkpointing + lora, {backend}", finite, f"loss {last['loss']:.4f} kl {last['kl']:.2e}"
        )
    policy = build_tiny_model(tok, hidden_size=64, num_layers=4, num_heads=4, intermediate_size=128)
    kl = {}
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
        if offload:
            report(
                "reference offload", where == {"cpu"} and kl[True] == kl[False], f"ref on {where}, kl {kl}"
            )


def check_memory_plan(device: str, tmp: Path, quick: bool) -> None:
    """Peak device memory of one trainer step against the plan (CUDA only)."""
    if device != "cuda":
        print("SKIP  memory plan vs peak: needs CUDA", flush=True)
        return
    tok = build_char_tokenizer()
    hidden, layers = (256, 4) if quick else (1024, 8)
    policy = build_tiny_model(
        tok, hidden_size=hidden, num_layers=layers, num_heads=8, intermediate_size=4 * hidden
    )
    for checkpointing in (False, True):
        args = config(
            tmp / f"mem-{checkpointing}",
            max_prompt_length=64,
            max_completion_length=64,
            per_device_train_batch_size=16,
            beta=0.04,
            gradient_checkpointing=checkpointing,
            generation_backend="fast",
        )
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        trainer = GRPOTrainer(copy.deepcopy(policy), [reward], args, train_dataset=ROWS, processing_class=tok)
        trainer.train()
        peak = torch.cuda.max_memory_allocated() - base
        plan = plan_memory(policy.config, args)
        ratio = peak / plan.peak
        report(
            f"memory plan (checkpointing={checkpointing})",
            0.5 <= ratio <= 1.5,
            f"measured {peak / 2**20:.1f} MiB, plan {plan.peak / 2**20:.1f} MiB, ratio {ratio:.2f}",
        )
        del trainer


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu/check.py: no CUDA device; run with --device cpu for the CPU smoke test")
        return 2
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        check_checkpointing_exact(args.device)
        check_trainer_lr0(args.device, tmp_path)
        check_lora_fast_sampler(args.device, tmp_path)
        check_backends_bf16(args.device, tmp_path)
        check_memory_plan(args.device, tmp_path, args.quick)
    print(f"{len(FAILURES)} failed ({', '.join(FAILURES) or 'none'}); {time.perf_counter() - started:.0f} s")
    return len(FAILURES)


if __name__ == "__main__":
    sys.exit(main())
