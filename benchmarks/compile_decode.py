"""The fast sampler's decode step eager against ``torch.compile`` (``compile_decode``), side by side.

For each model (a tiny Llama-style decoder built locally with random weights, ``--sizes``; or
SmolLM2-135M-Instruct with its real weights, ``--smollm2``): one FastSampler, ``--prompts`` x G =
``--group``, ``--tokens`` new tokens sampled at temperature 1 (no EOS); the first compiled call
(compilation included) timed on its own, then eager calls (the default step: its weights packed for oneDNN
where that pays, ``native_decode.call_packs``) and compiled calls alternated, and the median of each
reported with their ratio, and how many graphs torch.compile made in all (one per decode position would
mean it specialised on the position).

Usage (2 threads by default; run it alone on the machine):

    python benchmarks/compile_decode.py --sizes 64x2 256x4
    python benchmarks/compile_decode.py --smollm2 --prompts 1 --group 8 --tokens 32
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
from torch._dynamo.utils import counters

from grpokit.models.tiny import build_char_tokenizer, build_tiny_model
from grpokit.rollout.base import SamplingParams
from grpokit.rollout.fast import FastSampler, compiled_decode_step

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def measure(model: torch.nn.Module, prompts: list[list[int]], group: int, tokens: int, rounds: int) -> dict:
    params = SamplingParams(max_new_tokens=tokens, temperature=1.0, do_sample=True, eos_token_ids=())
    sampler = FastSampler(model.eval(), generator=torch.Generator().manual_seed(0))

    def timed(step) -> float:
        sampler.decode_step = step
        start = time.perf_counter()
        sampler.generate(prompts, group, params)
        return time.perf_counter() - start

    timed(None)  # warm-up
    graphs = counters["stats"]["unique_graphs"]
    first = timed(compiled_decode_step())
    eager, compiled = [], []
    for _ in range(rounds):
        eager.append(timed(None))
        compiled.append(timed(compiled_decode_step()))
    e, c = statistics.median(eager), statistics.median(compiled)
    return {
        "first_compiled_call_s": first,
        "eager_ms": 1000 * e,
        "compiled_ms": 1000 * c,
        "ratio": c / e,
        "graphs": counters["stats"]["unique_graphs"] - graphs,
    }


def report(name: str, r: dict) -> None:
    times = f"eager {r['eager_ms']:.1f} ms, compiled {r['compiled_ms']:.1f} ms, ratio {r['ratio']:.2f}"
    first = f"first compiled call {r['first_compiled_call_s']:.1f} s, {r['graphs']} graphs"
    print(f"{name}: {times}; {first}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["64x2", "256x4"], help="hidden x layers")
    parser.add_argument("--smollm2", action="store_true", help="SmolLM2-135M-Instruct instead of --sizes")
    parser.add_argument("--model", default=os.path.join(tempfile.gettempdir(), "grpokit-bench", "smollm2"))
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}; {args.prompts} prompts x G = {args.group}, "
          f"{args.tokens} new tokens, median of {args.rounds} alternating calls", flush=True)  # fmt: skip
    if args.smollm2:
        from smollm2 import prepare
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(prepare(args.model), dtype=torch.float32)
        prompts = [list(range(100 + i, 140 + 10 * i)) for i in range(args.prompts)]
        report("SmolLM2-135M", measure(model, prompts, args.group, args.tokens, args.rounds))
        return
    tokenizer = build_char_tokenizer()
    prompts = [[5 + (i * 7 + j) % 40 for j in range(12 + i % 5)] for i in range(args.prompts)]
    for size in args.sizes:
        hidden, layers = (int(x) for x in size.split("x"))
        model = build_tiny_model(tokenizer, hidden_size=hidden, num_layers=layers, num_heads=4, seed=0)
        report(size, measure(model, prompts, args.group, args.tokens, args.rounds))


if __name__ == "__main__":
    main()
