"""The fast sampler's prefill of W4's prompts, packed (their real tokens only) against left-padded to the
longest, on SmolLM2-135M-Instruct: seconds of each, alternated in one process, and the largest difference of
the prompt cache and first logits between the two.

    python benchmarks/packed_prefill.py [--model DIR] [--calls 0 1 2] [--rounds 3] [--bf16]

Call k prefills W4's dataset prompts 4k .. 4k+3 (a step's worth: ``benchmark_rows``, the workload's chat
prompts with its chat template).
A round times the padded prefill then the packed one (``FastSampler(padding_free=False / True)``); the
median of the rounds is reported, after one warm-up call of each.

Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def largest_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def timed_prefill(model, prompts: list[list[int]], packed: bool, autocast):
    """(seconds, the prefill) of one ``FastSampler(padding_free=packed)`` prefill of ``prompts``."""
    from grpokit.rollout.fast import FastSampler

    sampler = FastSampler(model, padding_free=packed)
    begin = time.perf_counter()
    with torch.inference_mode(), autocast:
        pre = sampler._prefill(prompts, torch.device("cpu"), keep_hf_cache=False)
    return time.perf_counter() - begin, pre


def compare(model, prompts: list[list[int]], rounds: int, autocast) -> None:
    """Time the padded and the packed prefill of ``prompts``, alternated; print both and their difference."""
    seconds: dict[bool, list[float]] = {False: [], True: []}
    made = {}
    timed_prefill(model, prompts, False, autocast), timed_prefill(model, prompts, True, autocast)  # warm-up
    for _ in range(rounds):
        for packed in (False, True):
            took, made[packed] = timed_prefill(model, prompts, packed, autocast)
            seconds[packed].append(took)
    padded, packed = statistics.median(seconds[False]), statistics.median(seconds[True])
    lengths = [len(p) for p in prompts]
    tokens = f"{made[False].tokens} padded, {made[True].tokens} packed"
    print(f"prompts of {lengths} tokens: backbone tokens {tokens}")
    rounds_text = " / ".join(", ".join(f"{x:.3f}" for x in seconds[way]) for way in (False, True))
    print(
        f"  padded {padded:.3f} s, packed {packed:.3f} s, ratio {packed / padded:.2f} (rounds {rounds_text})"
    )
    keys = largest_difference(made[True].keys, made[False].keys)
    values = largest_difference(made[True].values, made[False].values)
    logits = float((made[True].last_logits - made[False].last_logits).abs().max())
    print(f"  largest difference: keys {keys:.2e}, values {values:.2e}, first logits {logits:.2e}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(tempfile.gettempdir(), "grpokit-bench", "smollm2"))
    ap.add_argument("--calls", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast over the float32 weights")
    a = ap.parse_args()
    from common import NUM_DATASET_PROMPTS, WORKLOADS, benchmark_rows
    from smollm2 import prepare
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = prepare(a.model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    wl = WORKLOADS["W4"]
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if a.bf16 else contextlib.nullcontext()
    precision = "bf16 autocast" if a.bf16 else "fp32"
    capability = torch.backends.cpu.get_cpu_capability()
    threads = torch.get_num_threads()
    print(f"SmolLM2-135M-Instruct, {precision}, {threads} threads, torch {torch.__version__}, {capability}")
    rows = benchmark_rows(wl, NUM_DATASET_PROMPTS, seed=0)
    template = {"add_generation_prompt": True, "tokenize": True, "return_dict": True}
    for call in a.calls:
        chunk = rows[call * wl.num_prompts : (call + 1) * wl.num_prompts]
        prompts = [list(tokenizer.apply_chat_template(r["prompt"], **template)["input_ids"]) for r in chunk]
        print(f"call {call}: ", end="")
        compare(model, prompts, a.rounds, autocast)


if __name__ == "__main__":
    main()
