"""The ways the decode step can run its linear maps on this CPU: ``F.linear(x, W)`` (by rows, x @ W.T),
``(W @ x.T).T`` (by columns; one row computed as two equal ones) and oneDNN's product on the weight packed
once into its blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, ``_linear_pointwise``: what the
native decoder runs where ``packs_weights`` says so). Over SmolLM2-135M-Instruct's four projections per
layer (fused q/k/v 960 x 576, o 576 x 576, fused gate/up 3072 x 576, down 576 x 1536) in 30 layers of
distinct random weights, so that each product reads its weight from memory as a decode step does, and
over its LM head (49,152 x 576).

    python benchmarks/decode_orientation.py [--rows 1 2 3 4 8 14 16 24 32 64] [--repeats 5]

Prints the milliseconds of one pass over the 120 products, and of one LM-head product, at each row count,
float32 and bfloat16 (packed only where ``packs_weights`` allows it: oneDNN refuses bfloat16 without
AVX-512). Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import time

import torch

from grpokit.rollout.native_decode import pack_weight, packed_linear, packs_weights

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))
"""[out, in] of SmolLM2-135M's fused q/k/v, o, fused gate/up and down projections."""
HEAD = (49152, 576)
"""[out, in] of its LM head."""


def by_rows(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight)


def by_columns(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    rows = x.shape[0]
    if rows == 1:
        x = torch.cat([x, x])
    return (weight @ x.T)[:, :rows].T.contiguous()


def packed(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``weight`` packed by ``pack_weight``: the native decoder's own product."""
    return packed_linear(x, weight)


def milliseconds(step, repeats: int) -> float:
    step()
    step()
    begin = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - begin) / repeats * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 8, 14, 16, 24, 32, 64])
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    torch.manual_seed(0)
    print(f"{torch.get_num_threads()} threads, CPU capability {torch.backends.cpu.get_cpu_capability()}; "
          "ms per pass over 30 layers x 4 projections | ms per LM-head product")  # fmt: skip
    for dtype in (torch.float32, torch.bfloat16):
        weights = [torch.randn(o, i, dtype=dtype) for _ in range(30) for o, i in SHAPES]
        head = torch.randn(*HEAD, dtype=dtype)
        print(f"{str(dtype).removeprefix('torch.')}")
        print("rows  by-rows  by-columns  packed   | by-rows  by-columns  packed")
        ways = ((by_rows, weights, head), (by_columns, weights, head))
        packs_here = packs_weights(torch.device("cpu"), dtype)  # else oneDNN refuses (bf16 without AVX-512)
        with torch.inference_mode():
            for rows in a.rows:
                inputs = {i: torch.randn(rows, i, dtype=dtype) for i in (576, 1536)}
                if packs_here:
                    packs = [pack_weight(w, rows) for w in weights]
                    ways_here = (*ways, (packed, packs, pack_weight(head, rows)))
                else:
                    ways_here = ways
                times, heads = [], []
                for f, ws, h in ways_here:
                    times.append(milliseconds(lambda f=f, x=inputs, ws=ws: [f(x[w.shape[1]], w) for w in ws],
                                              a.repeats))  # fmt: skip
                    heads.append(milliseconds(lambda f=f, x=inputs[576], h=h: f(x, h), a.repeats))
                packed_ms = (f"{times[2]:<8.2f}", f"{heads[2]:.2f}") if packs_here else (f"{'-':<8}", "-")
                print(f"{rows:<5} {times[0]:<8.2f} {times[1]:<11.2f} {packed_ms[0]} | "
                      f"{heads[0]:<8.2f} {heads[1]:<11.2f} {packed_ms[1]}")  # fmt: skip


if __name__ == "__main__":
    main()
