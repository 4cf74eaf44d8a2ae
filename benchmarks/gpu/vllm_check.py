"""The vLLM backend on GPU, one part per process (each part builds its own engine):

    python benchmarks/gpu/vllm_check.py sampling    # colocate: greedy and sampled vs the fast sampler
    python benchmarks/gpu/vllm_check.py train       # colocate: a GRPOTrainer step, weights synced, IS metrics
    python benchmarks/gpu/vllm_check.py train-lora  # the same with a LoRA policy (merged adapters pushed)
    python benchmarks/gpu/vllm_check.py server      # server mode: `vllm serve` as `trl vllm-serve` runs it

``bash benchmarks/gpu/vllm_check.sh`` runs all four within 10 minutes on one GPU; without vLLM or a GPU it
fails (nothing checked is not a pass). Each check prints PASS/FAIL with its numbers; the exit status is the
number of failed checks. What only a GPU run shows (tests/vllm runs the rest on vLLM's CPU engine): CUDA
kernels and their bf16 numerics against the trainer's, compiled engines (CUDA graphs), sleep mode (level 2:
the memory it frees and the cost of waking and pushing, against level 1's offload), and the server's NCCL
weight transfer.

The policy is grpokit's tiny Llama (``build_tiny_model``), saved locally, with its LM head scaled x10 so
that its next-token distributions are peaked (a random tiny model's are nearly flat, and greedy decoding
would then hinge on bf16 rounding). Engine and reference both run in bfloat16; vLLM is compared with
grpokit's fast sampler *relative to an fp32 reference*: vLLM must be as close to the exact model as the fast
sampler is (within a margin), which checks the weights it holds, its sampling and its log-probs without
pretending two bf16 kernels agree bit for bit.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.models import build_char_tokenizer, build_tiny_model
from grpokit.rollout import FastSampler, SamplingParams

FAILURES: list[str] = []
ROWS = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(1, 9) for b in range(1, 9)]
TEXTS = ["1+2=", "3+4=", "7+8=", "5+5=", "2+9=", "6+1=", "4+4=", "9+3="]


def report(name: str, ok: bool, detail: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)
    if not ok:
        FAILURES.append(name)


def reward(prompts, completions, completion_ids, solution, **kwargs):
    return [(1.0 if s in c else 0.0) + 0.1 * len(c) for c, s in zip(completions, solution)]


def build_policy(directory: Path) -> Path:
    """The tiny Llama (untied head scaled x10) and its tokenizer, saved to ``directory``."""
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, num_heads=4, tie_word_embeddings=False)
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def load(directory: Path, dtype: torch.dtype) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).to("cuda").eval()


def prompts_and_params(
    directory: Path, *, greedy: bool, max_new: int = 10
) -> tuple[list[list[int]], SamplingParams]:
    tokenizer = AutoTokenizer.from_pretrained(directory)
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS]
    eos = (tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ()
    return ids, SamplingParams(max_new_tokens=max_new, do_sample=not greedy, eos_token_ids=eos)


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """The fraction of identical completions."""
    return sum(x == y for x, y in zip(a, b)) / len(a)


@torch.no_grad()
def exact_logprobs(
    model: torch.nn.Module, prompt: list[int], completions: list[list[int]]
) -> list[list[float]]:
    """log p(token) of each completion token under ``model`` (temperature 1, no filter)."""
    rows = [prompt + c for c in completions]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows], device="cuda")
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device="cuda")
    logp = model(input_ids=ids, attention_mask=mask).logits.float().log_softmax(-1)  # [B, T, V]
    start = len(prompt) - 1
    return [[float(logp[i, start + t, tok]) for t, tok in enumerate(c)] for i, c in enumerate(completions)]


@torch.no_grad()
def first_token_tv(model: torch.nn.Module, prompt: list[int], completions: list[list[int]]) -> float:
    """Total variation between the empirical first-token distribution and the model's exact one."""
    probs = model(input_ids=torch.tensor([prompt], device="cuda")).logits[0, -1].float().softmax(-1)
    counts = torch.zeros_like(probs)
    for c in completions:
        counts[c[0]] += 1
    return 0.5 * float((counts / len(completions) - probs).abs().sum())


def compare_sampled(name: str, backend, fast, exact: torch.nn.Module, prompts, params, n: int) -> None:
    """Sampled completions of ``backend`` (vLLM) and ``fast`` against the fp32 model ``exact``: the log-prob
    each reports for its tokens, and the first-token distribution."""
    errors, tvs = {}, {}
    for label, sampler in (("vllm", backend), ("fast", fast)):
        out = sampler.generate(prompts, n, params)
        err, count, tv = 0.0, 0, 0.0
        for k, prompt in enumerate(prompts):
            rows = out.completion_ids[k * n : (k + 1) * n]
            reported = out.logprobs[k * n : (k + 1) * n]
            for got, want in zip(reported, exact_logprobs(exact, prompt, rows)):
                err += sum(abs(g - w) for g, w in zip(got, want) if g == g)  # NaN: unknown
                count += len(want)
            tv += first_token_tv(exact, prompt, rows) / len(prompts)
        errors[label], tvs[label] = err / max(count, 1), tv
    detail = (
        f"mean |logp - exact| vllm {errors['vllm']:.4f} vs fast {errors['fast']:.4f}; first-token TV "
        f"vllm {tvs['vllm']:.3f} vs fast {tvs['fast']:.3f} ({n} samples per prompt)"
    )
    ok = errors["vllm"] <= 2 * errors["fast"] + 0.02 and tvs["vllm"] <= 1.5 * tvs["fast"] + 0.05
    report(name, ok, detail)


def compare_greedy(name: str, vllm_ids, fast_ids, exact_ids) -> None:
    """Greedy completions: vLLM as close to the fp32 model's as the bf16 fast sampler (margin 1/8)."""
    ours, theirs = agreement(vllm_ids, exact_ids), agreement(fast_ids, exact_ids)
    report(name, ours >= theirs - 0.125, f"identical to fp32 greedy: vllm {ours:.2f}, fast {theirs:.2f}")


def vllm_config(out: Path, **overrides) -> GRPOConfig:
    values = dict(
        output_dir=str(out), use_vllm=True, vllm_gpu_memory_utilization=0.2, max_prompt_length=16,
        max_steps=2, num_generations=4, per_device_train_batch_size=16, max_completion_length=8,
        learning_rate=1e-2, beta=0.0, disable_tqdm=True, seed=0, logging_steps=1, temperature=0.7,
        model_init_kwargs={"dtype": "bfloat16"}, generation_dtype="bfloat16",
    )  # fmt: skip
    return GRPOConfig(**{**values, **overrides})


# ---- parts ----------------------------------------------------------------------------------------------
def part_sampling(tmp: Path) -> None:
    from grpokit.rollout.vllm_backend import make_vllm_backend

    directory = build_policy(tmp / "policy")
    model, exact = load(directory, torch.bfloat16), load(directory, torch.float32)
    backend = make_vllm_backend(vllm_config(tmp / "run").vllm_settings(), model)
    fast = FastSampler(model)
    prompts, greedy = prompts_and_params(directory, greedy=True)
    compare_greedy(
        "colocate greedy",
        backend.generate(prompts, 1, greedy).completion_ids,
        fast.generate(prompts, 1, greedy).completion_ids,
        FastSampler(exact).generate(prompts, 1, greedy).completion_ids,
    )
    prompts, sampled = prompts_and_params(directory, greedy=False, max_new=6)
    compare_sampled("colocate sampling", backend, fast, exact, prompts[:4], sampled, n=512)


def check_synced(label: str, trainer: GRPOTrainer, directory: Path, before: list[list[int]]) -> None:
    """After a step, the engine holds the updated weights: its log-probs of its own samples are those of the
    updated policy, not of the initial one, and its greedy completions are the fast sampler's."""
    prompts, greedy = prompts_and_params(directory, greedy=True)
    after = trainer.backend.generate(prompts, 1, greedy).completion_ids  # pushes the updated weights first
    same = agreement(after, FastSampler(trainer.model).generate(prompts, 1, greedy).completion_ids)
    prompts, sampled = prompts_and_params(directory, greedy=False, max_new=6)
    out = trainer.backend.generate(prompts[:4], 64, sampled)
    initial, errors = load(directory, torch.bfloat16), {"updated": 0.0, "initial": 0.0}
    for label_, model in (("updated", trainer.model), ("initial", initial)):
        total, count = 0.0, 0
        for k, prompt in enumerate(prompts[:4]):
            rows, got = out.completion_ids[k * 64 : (k + 1) * 64], out.logprobs[k * 64 : (k + 1) * 64]
            for g_row, w_row in zip(got, exact_logprobs(model, prompt, rows)):
                total += sum(abs(g - w) for g, w in zip(g_row, w_row) if g == g)
                count += len(w_row)
        errors[label_] = total / max(count, 1)
    ok = errors["updated"] < 0.5 * errors["initial"] and same >= 0.75
    detail = (
        f"mean |vLLM logp - policy logp|: updated {errors['updated']:.4f}, initial {errors['initial']:.4f}; "
        f"greedy changed by the step {1 - agreement(before, after):.2f}; vLLM = fast after: {same:.2f}"
    )
    report(f"{label}: weights synced after a step", ok, detail)


def check_correction(label: str, history: list[dict[str, float]]) -> None:
    """The importance-sampling metrics of each step, by value: bf16 engine and bf16 trainer at temperature
    0.7 differ by kernel rounding only (mean |delta logp| < 0.05; log-probs taken before the temperature, or
    of another model, differ by far more), and the ratios lie on both sides of 1, near it."""
    for metrics in history:
        diff = metrics.get("sampling/sampling_logp_difference/mean", float("nan"))
        low = metrics.get("sampling/importance_sampling_ratio/min", float("nan"))
        mean = metrics.get("sampling/importance_sampling_ratio/mean", float("nan"))
        high = metrics.get("sampling/importance_sampling_ratio/max", float("nan"))
        ok = 0 < diff < 0.05 and low <= 1 <= high and abs(mean - 1) < 0.1
        report(
            f"{label}: IS metrics, step {metrics.get('step')}", ok,
            f"logp difference mean {diff:.4f}, ratio min/mean/max {low:.4f}/{mean:.4f}/{high:.4f}",
        )  # fmt: skip


def measure_sleep(backend) -> None:
    """Sleep mode on the GPU: the memory level 2 frees and the time to wake and push, against level 1
    (weights offloaded to host memory and copied back) on the same engine."""
    timings = {}
    for level in (1, 2):
        torch.cuda.synchronize()
        free = torch.cuda.mem_get_info()[0]
        started = time.monotonic()
        if level == 1:
            backend.llm.sleep(level=1)
        else:
            backend.release_memory()  # what the trainer calls before its passes: level 2
        slept = time.monotonic() - started
        freed = torch.cuda.mem_get_info()[0] - free
        started = time.monotonic()
        if level == 1:
            backend.llm.wake_up()
        else:
            backend.sync_weights()  # what the trainer calls after the update: wake, push, KV cache
        timings[level] = (slept, time.monotonic() - started, freed / 2**20)
    detail = "; ".join(
        f"level {lv}: sleep {s:.3f} s, wake{' + push' if lv == 2 else ''} {w:.3f} s, freed {f:.0f} MiB"
        for lv, (s, w, f) in timings.items()
    )
    report("sleep mode levels 1 and 2", timings[2][2] > 0, detail)


def part_train(tmp: Path, lora: bool) -> None:
    """Two GRPOTrainer steps with a large learning rate at temperature 0.7; the LoRA run also sleeps the
    engine (level 2) through each update."""
    directory = build_policy(tmp / "policy")
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    label = "colocate lora + sleep mode" if lora else "colocate"
    args = vllm_config(tmp / "run", learning_rate=5e-2 if lora else 1e-2, vllm_enable_sleep_mode=lora)
    trainer = GRPOTrainer(str(directory), [reward], args, train_dataset=ROWS, peft_config=peft_config)
    prompts, greedy = prompts_and_params(directory, greedy=True)
    before = trainer.backend.generate(prompts, 1, greedy).completion_ids
    history = trainer.train()
    pushes = trainer.backend.pushes
    report(f"{label}: one push per step", pushes == 1 + 2, f"{pushes} pushes for 2 steps (1 + one per step)")
    pushed = [m.get("time/weight_push", float("nan")) for m in history]
    report(f"{label}: push timed", all(t > 0 for t in pushed), f"time/weight_push {pushed} s")
    check_correction(label, history)
    check_synced(label, trainer, directory, before)
    if lora:
        measure_sleep(trainer.backend)
        check_synced(f"{label} after sleeping", trainer, directory, before)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(directory: Path, port: int, gpu: str, log: Path) -> subprocess.Popen:
    """vLLM's server, as TRL 1.16's `trl vllm-serve` runs it (dev mode, NCCL weight transfer, processed
    log-probs), on GPU ``gpu``."""
    command = [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(directory), "--host", "127.0.0.1",
        "--port", str(port), "--dtype", "bfloat16", "--max-model-len", "128",
        "--gpu-memory-utilization", "0.2", "--enforce-eager", "--generation-config", "vllm",
        "--weight-transfer-config", '{"backend": "nccl"}',
        "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1",
    ]  # fmt: skip
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "CUDA_VISIBLE_DEVICES": gpu}
    print("server:", " ".join(command), flush=True)
    return subprocess.Popen(
        command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def part_server(tmp: Path) -> None:
    from grpokit.rollout.vllm_client import VLLMServerBackend, VLLMServerClient

    directory = build_policy(tmp / "policy")
    gpus = torch.cuda.device_count()
    port, log = free_port(), tmp / "server.log"
    server = start_server(directory, port, "1" if gpus >= 2 else "0", log)
    try:
        client = VLLMServerClient(f"http://127.0.0.1:{port}")
        started = time.monotonic()
        client.wait_until_healthy(300)
        print(f"server up after {time.monotonic() - started:.0f} s", flush=True)
        model, exact = load(directory, torch.bfloat16), load(directory, torch.float32)
        backend = VLLMServerBackend(client, None, None)  # the server's own (checkpoint) weights
        prompts, greedy = prompts_and_params(directory, greedy=True)
        compare_greedy(
            "server greedy",
            backend.generate(prompts, 1, greedy).completion_ids,
            FastSampler(model).generate(prompts, 1, greedy).completion_ids,
            FastSampler(exact).generate(prompts, 1, greedy).completion_ids,
        )
        prompts, sampled = prompts_and_params(directory, greedy=False, max_new=6)
        compare_sampled("server sampling", backend, FastSampler(model), exact, prompts[:4], sampled, n=512)
        del model, exact
        if gpus < 2:
            print("SKIP  server weight sync: NCCL cannot put the trainer and the server on one GPU; "
                  "it needs 2 GPUs (server on GPU 1, trainer on GPU 0)", flush=True)  # fmt: skip
            return
        args = vllm_config(
            tmp / "run", vllm_mode="server", vllm_server_host="127.0.0.1", vllm_server_port=port,
            vllm_group_port=free_port(),
        )  # fmt: skip
        trainer = GRPOTrainer(str(directory), [reward], args, train_dataset=ROWS)
        prompts, greedy = prompts_and_params(directory, greedy=True)
        before = trainer.backend.generate(prompts, 1, greedy).completion_ids
        trainer.train()
        check_synced("server (NCCL weight transfer)", trainer, directory, before)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        if FAILURES:
            print(log.read_text()[-4000:], flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=["sampling", "train", "train-lora", "server"])
    part = parser.parse_args().part
    if not torch.cuda.is_available():
        print(f"FAIL  {part}: no CUDA GPU, nothing checked", flush=True)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        if part == "sampling":
            part_sampling(Path(tmp))
        elif part == "server":
            part_server(Path(tmp))
        else:
            part_train(Path(tmp), lora=part == "train-lora")
        print(f"{part}: {time.monotonic() - started:.0f} s, {len(FAILURES)} failed", flush=True)
    return len(FAILURES)


if __name__ == "__main__":
    sys.exit(main())
