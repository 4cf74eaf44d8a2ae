"""The two orientations of the decode step's linear maps on this CPU: ``F.linear(x, W)`` (by rows, x @ W.T)
against ``(W @ x.T).T`` (by columns; one row computed as two equal ones), over SmolLM2-135M-Instruct's four
projections per layer (fused q/k/v 960 x 576, o 576 x 576, fused gate/up 3072 x 576, down 576 x 1536) in 30
layers of distinct random weights, so that each product reads its weight from memory as a decode step does.

    python benchmarks/decode_orientation.py [--rows 1 2 3 4 8 16 32 64] [--repeats 5]

Prints the milliseconds of one pass over the 120 products at each row count, float32 and bfloat16. Run it
alone on the machine.
"""

from __future__ import annotations

import argparse
import time

import torch

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))
"""[out, in] of SmolLM2-135M's fused q/k/v, o, fused gate/up and down projections."""


def by_rows(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight)


def by_columns(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    rows = x.shape[0]
    if rows == 1:
        x = torch.cat([x, x])
    return (weight @ x.T)[:, :rows].T.contiguous()


def milliseconds(step, repeats: int) -> float:
    step()
    step()
    begin = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - begin) / repeats * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 8, 16, 32, 64])
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    torch.manual_seed(0)
    print(f"{torch.get_num_threads()} threads; ms per pass over 30 layers x 4 projections")
    for dtype in (torch.float32, torch.bfloat16):
        weights = [torch.randn(o, i, dtype=dtype) for _ in range(30) for o, i in SHAPES]
        print(f"{str(dtype).removeprefix('torch.')}\nrows  by-rows  by-columns  rows/columns")
        with torch.inference_mode():
            for rows in a.rows:
                inputs = {i: torch.randn(rows, i, dtype=dtype) for i in (576, 1536)}
                times = [milliseconds(lambda f=f, x=inputs, ws=weights: [f(x[w.shape[1]], w) for w in ws],
                                      a.repeats) for f in (by_rows, by_columns)]  # fmt: skip
                print(f"{rows:<5} {times[0]:<8.2f} {times[1]:<11.2f} {times[0] / times[1]:.2f}")


if __name__ == "__main__":
    main()
