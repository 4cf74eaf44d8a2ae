"""The fast sampler's decode step eager against ``torch.compile`` (``compile_decode``), side by side.

For each model size (a tiny Llama-style decoder built locally, random weights): one FastSampler, 16 prompts
x G = 8, 32 new tokens sampled at temperature 1; the first compiled call (compilation included) timed on
its own, then eager and compiled calls alternated, and the median of each reported with their ratio.

Usage (2 threads by default):

    python benchmarks/compile_decode.py --sizes 64x2 256x4
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from grpokit.models.tiny import build_char_tokenizer, build_tiny_model
from grpokit.rollout.base import SamplingParams
from grpokit.rollout.fast import FastSampler, compiled_decode_step
from grpokit.rollout.native_decode import NativeDecoder


def measure(hidden: int, layers: int, rounds: int) -> dict[str, float]:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=hidden, num_layers=layers, num_heads=4, seed=0)
    prompts = [[5 + (i * 7 + j) % 40 for j in range(12 + i % 5)] for i in range(16)]
    params = SamplingParams(max_new_tokens=32, temperature=1.0, do_sample=True, eos_token_ids=())
    sampler = FastSampler(model.eval(), generator=torch.Generator().manual_seed(0))

    def timed(step) -> float:
        sampler.decode_step = step
        start = time.perf_counter()
        sampler.generate(prompts, 8, params)
        return time.perf_counter() - start

    timed(NativeDecoder.__call__)  # warm-up
    first = timed(compiled_decode_step())
    eager, compiled = [], []
    for _ in range(rounds):
        eager.append(timed(NativeDecoder.__call__))
        compiled.append(timed(compiled_decode_step()))
    e, c = statistics.median(eager), statistics.median(compiled)
    return {"first_compiled_call_s": first, "eager_ms": 1000 * e, "compiled_ms": 1000 * c, "ratio": c / e}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["64x2", "256x4"], help="hidden x layers")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for size in args.sizes:
        hidden, layers = (int(x) for x in size.split("x"))
        r = measure(hidden, layers, args.rounds)
        print(f"{size}: eager {r['eager_ms']:.1f} ms, compiled {r['compiled_ms']:.1f} ms, "
              f"ratio {r['ratio']:.2f}; first compiled call {r['first_compiled_call_s']:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
