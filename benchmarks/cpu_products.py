"""torch's float32 products (MKL's sgemm on x86) against oneDNN's (``grpokit.models.cpu_linear``) at the
training passes' shapes of SmolLM2-135M: each linear's forward y = x W^T, input gradient dx = dY W and weight
gradient dW = dY^T x, GFLOP/s, the best of 5 after 2 warm-ups, and the largest difference between the two
results relative to the largest value (rounding only: both accumulate in float32).

    python benchmarks/cpu_products.py [--rows 1024] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import torch

HIDDEN, INTERMEDIATE, KV, VOCAB = 576, 1536, 192, 49152
SHAPES = {  # name: (out, in) of the weight
    "q_proj / o_proj": (HIDDEN, HIDDEN),
    "k_proj / v_proj": (KV, HIDDEN),
    "gate_proj / up_proj": (INTERMEDIATE, HIDDEN),
    "down_proj": (HIDDEN, INTERMEDIATE),
}


def best_seconds(fn, repeats: int = 5) -> float:
    fn(), fn()
    best = float("inf")
    for _ in range(repeats):
        begin = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - begin)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1024, help="tokens of a micro-batch's products")
    ap.add_argument("--head-rows", type=int, default=170, help="rows of an LM-head chunk (head_chunk_rows)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from grpokit.models.cpu_linear import onednn_available

    print(
        f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
        f"{torch.get_num_threads()} threads; oneDNN's float32 products used: {onednn_available()}"
    )
    print("| product | rows | torch GFLOP/s | oneDNN GFLOP/s | speed-up | max difference |")
    print("|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    shapes = {**SHAPES, "LM head": (VOCAB, HIDDEN)}
    for name, (out, inp) in shapes.items():
        rows = a.head_rows if name == "LM head" else a.rows
        x = torch.randn(rows, inp, generator=gen)
        w = torch.randn(out, inp, generator=gen) / inp**0.5
        dy = torch.randn(rows, out, generator=gen)
        flop = 2 * rows * inp * out
        with torch.no_grad():
            for what, (plain, onednn) in products(x, w, dy).items():
                t_plain, t_onednn = best_seconds(plain), best_seconds(onednn)
                want, got = plain(), onednn()
                diff = float((got - want).abs().max() / want.abs().max())
                print(
                    f"| {name}: {what} | {rows} | {flop / t_plain / 1e9:.0f} | {flop / t_onednn / 1e9:.0f} "
                    f"| {t_plain / t_onednn:.2f} | {diff:.1e} |"
                )


def products(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor) -> dict:
    """A linear layer's three products: ``{name: (torch's, oneDNN's)}``."""
    from grpokit.models.cpu_linear import linear, matmul

    return {
        "y = x W^T": (lambda: x @ w.t(), lambda: linear(x, w)),
        "dx = dY W": (lambda: dy @ w, lambda: matmul(dy, w)),
        "dW = dY^T x": (lambda: dy.t() @ x, lambda: matmul(dy.t(), x)),
    }


if __name__ == "__main__":
    main()
