"""What one decode step of the fast sampler costs against the number of rows still running, on
SmolLM2-135M-Instruct: the fixed part that every step pays however few rows remain.

For each row count, ``FastSampler.generate`` samples that many completions of one 100-token prompt twice, with
``max_new_tokens`` 1 and 1 + N (no EOS); the difference over N is the time of one decode step. A line
fitted through the row counts splits it into a per-step cost and a per-row cost.

    python benchmarks/decode_rows.py [--model DIR] [--bf16] [--steps 64] [--rows 1 2 4 8 16 32] [--unpacked]
                                     [--packed-rows N]

``--unpacked`` runs the decode's products on the weights as they are, as where ``packs_weights`` says no;
without it, every call packs its weights where ``packs_weights`` allows it, however short (the packing is
in both calls of a row count, so the difference is the decode steps' time alone). ``--packed-rows N``: the
fewest float32 rows whose products run packed, fewer by columns on the plain weights (default: this
processor's, ``packed_fp32_min_rows``: 1 on Zen 5, 3 elsewhere).

Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(tempfile.gettempdir(), "grpokit-bench", "smollm2"))
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast over the float32 weights")
    ap.add_argument("--unpacked", action="store_true", help="products on the weights as they are")
    ap.add_argument("--steps", type=int, default=64, help="decode steps timed per row count")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--packed-rows", type=int, default=None, help="fewest float32 rows run packed")
    a = ap.parse_args()
    from grpokit.rollout import native_decode

    if a.unpacked:
        native_decode.packs_weights = lambda device, dtype: False
    if a.packed_rows is not None:
        native_decode.packed_fp32_min_rows = lambda: a.packed_rows
    # every call packs where the processor allows it, the 1-token one subtracted too: its packing cancels
    native_decode.packing_pays = lambda dtype, rows, max_new: True
    from smollm2 import prepare
    from transformers import AutoModelForCausalLM

    from grpokit.rollout.base import SamplingParams
    from grpokit.rollout.fast import FastSampler

    model = AutoModelForCausalLM.from_pretrained(prepare(a.model), dtype=torch.float32)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if a.bf16 else contextlib.nullcontext()
    prompt = [list(range(100, 200))]
    precision = "bf16 autocast" if a.bf16 else "fp32"
    fewest = native_decode.packed_fp32_min_rows()
    print(f"SmolLM2-135M-Instruct, {precision}, {torch.get_num_threads()} threads, {a.steps} decode steps, "
          f"float32 products packed from {fewest} rows")  # fmt: skip

    def seconds(rows: int, new_tokens: int) -> float:
        sampler = FastSampler(model, generator=torch.Generator().manual_seed(0))
        begin = time.perf_counter()
        with autocast:
            sampler.generate(prompt, rows, SamplingParams(max_new_tokens=new_tokens))
        return time.perf_counter() - begin

    per_step = {}
    for rows in a.rows:
        seconds(rows, 1 + a.steps)  # warm-up
        runs = [seconds(rows, 1 + a.steps) - seconds(rows, 1) for _ in range(2)]
        per_step[rows] = min(runs) / a.steps
        print(f"  {rows:3d} rows: {per_step[rows] * 1e3:7.1f} ms per decode step")
    xs, ys = list(per_step), list(per_step.values())
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mean_x) ** 2 for x in xs
    )
    print(f"fit: {(mean_y - slope * mean_x) * 1e3:.1f} ms per step + {slope * 1e3:.2f} ms per running row")


if __name__ == "__main__":
    main()
