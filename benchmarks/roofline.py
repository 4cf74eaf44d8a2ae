"""Roofline of the benchmark's GRPO step: matmul FLOPs per phase from the model's config, this machine's
measured matmul rate at those shapes, and the fraction of it each phase of a measured run achieves.

FLOPs count matrix products only (2 m n k each), as grpokit computes them:
- generate: each distinct prompt prefilled once (LM head at its last position only), then one decode step
  per new token for every row (backbone, LM head, attention over the context so far);
- log-prob passes (reference, old policy, training forward): the shared-prefix forward, so each group's
  prompt runs once and the completions attend to it; the LM head only at completion positions;
- backward: twice the training forward, plus one more LM-head product per completion token (grpokit
  recomputes each logits chunk instead of storing [M, V] logits).
Attention is 4 x context x hidden per token and layer (scores and values). Element-wise work (norms,
rotary, softmax, sampling) is not counted: the gap between a phase's time and its roofline time is that work,
framework overhead and matmuls running below the measured rate.

    python benchmarks/roofline.py --results benchmarks/results/summary-2core.json

prints one table per workload (markdown). The matmul rates are measured here on torch's current threads; run
it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import WORKLOADS, Workload


@dataclass(frozen=True)
class Shape:
    """The decoder's sizes (from its config.json)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int

    @property
    def kv_width(self) -> int:
        return self.hidden // self.heads * self.kv_heads

    def backbone_matrices(self) -> list[tuple[int, int]]:
        """(k, n) of every weight product of one layer: q, k, v, o, gate, up, down."""
        h, i, kv = self.hidden, self.intermediate, self.kv_width
        return [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)]


def phase_products(shape: Shape, wl: Workload) -> dict[str, list[tuple[int, int, int, int]]]:
    """Per phase, the matmuls as (count, m, k, n): ``count`` products of [m, k] x [k, n]."""
    P, G, L = wl.num_prompts, wl.num_generations, wl.prompt_len
    rows, new = P * G, wl.max_new_tokens
    h = shape.hidden

    def backbone(m: int, times: int = 1) -> list[tuple[int, int, int, int]]:
        return [(shape.layers * times, m, k, n) for k, n in shape.backbone_matrices()]

    def attention(queries: int, context: float, times: int = 1) -> list[tuple[int, int, int, int]]:
        # scores q k^T and probs v, over every head: 2 products of [queries, h] x [h, context]
        return [(2 * shape.layers * times, queries, h, round(context))]

    generate = backbone(P * L) + attention(P * L, L / 2)  # prefill, causal: mean context L/2
    generate += [(1, P, h, shape.vocab)]  # the prefill's last-position logits
    generate += [*backbone(rows, new), (new, rows, h, shape.vocab)]  # decode steps
    generate += attention(rows, L + new / 2, new)
    forward = backbone(P * L) + attention(P * L, L / 2)  # each group's prompt once (shared prefix)
    forward += backbone(rows * new) + attention(rows * new, L + new / 2)
    forward += [(1, rows * new, h, shape.vocab)]  # LM head at completion positions only
    mu = wl.num_iterations
    phases = {"generate": generate}
    if wl.beta > 0:
        phases["ref_logps"] = forward
    if mu > 1:
        phases["old_logps"] = forward
    phases["policy_forward"] = [(c * mu, m, k, n) for c, m, k, n in forward]
    recompute = (mu, rows * new, h, shape.vocab)  # the LM-head chunks the backward recomputes
    phases["backward"] = [*[(2 * c * mu, m, k, n) for c, m, k, n in forward], recompute]
    return phases


def measured_rate(m: int, k: int, n: int, cache: dict) -> float:
    """FLOP/s of torch.mm at [m, k] x [k, n] on this machine (best of a few repeats of ~0.2 s)."""
    import torch

    key = (m, k, n)
    if key not in cache:
        a, b = torch.randn(m, k), torch.randn(k, n)
        torch.mm(a, b)
        reps = max(1, int(2e8 / (2 * m * k * n)))
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(reps):
                torch.mm(a, b)
            best = min(best, (time.perf_counter() - start) / reps)
        cache[key] = 2 * m * k * n / best
    return cache[key]


def roofline(products: list[tuple[int, int, int, int]], cache: dict) -> tuple[float, float]:
    """(GFLOP, seconds at the measured rates) of a phase's products."""
    flops = sum(2 * c * m * k * n for c, m, k, n in products)
    seconds = sum(2 * c * m * k * n / measured_rate(m, k, n, cache) for c, m, k, n in products)
    return flops / 1e9, seconds


def model_dir(kind: str, work_dir: str) -> str:
    """The workload's model directory (built or converted on first use, as bench_grpo.py does)."""
    if kind == "tiny":
        from tiny_model import build

        return build(os.path.join(work_dir, "model"))
    from smollm2 import prepare

    return prepare(os.path.join(work_dir, kind))


def prompt_tokens(wl: Workload, folder: str) -> int:
    """Mean prompt length in tokens: ``prompt_len``, or the chat prompts rendered with the chat template."""
    if wl.model == "tiny":
        return wl.prompt_len
    from common import benchmark_rows
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    rows = benchmark_rows(wl, 64, 0)
    texts = [
        tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows
    ]
    lengths = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]
    return round(sum(lengths) / len(lengths))


def model_shape(folder: str) -> Shape:
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    return Shape(
        config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"],
        config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"],
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="benchmarks/results/summary-2core.json")
    ap.add_argument("--out", default=None, help="also write the tables' numbers as JSON here")
    ap.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "grpokit-bench"))
    args = ap.parse_args()
    with open(args.results) as f:
        results = json.load(f)["workloads"]
    cache, report = {}, {}
    for name, wl in WORKLOADS.items():
        if name not in results:
            continue
        folder = model_dir(wl.model, args.work_dir)
        shape = model_shape(folder)
        wl = dataclasses.replace(wl, prompt_len=prompt_tokens(wl, folder))
        grpokit, trl = results[name]["grpokit"]["phases"], results[name]["trl"]["phases"]
        print(f"\n{name}: {wl}\n")
        print("| phase | GFLOP | roofline s | grpokit s | achieved | TRL s |")
        print("|---|---|---|---|---|---|")
        total_floor = total_time = 0.0
        report[name] = {}
        phases = phase_products(shape, wl)
        if grpokit.get("policy_forward", 0.0) == 0.0:  # the trainer times the whole update as one phase
            phases["backward"] = phases.pop("policy_forward") + phases["backward"]
            trl = {**trl, "backward": trl.get("policy_forward", 0.0) + trl.get("backward", 0.0)}
        for phase, products in phases.items():
            gflop, floor = roofline(products, cache)
            spent = grpokit.get(phase, 0.0)
            total_floor, total_time = total_floor + floor, total_time + spent
            report[name][phase] = {"gflop": gflop, "roofline_s": floor, "grpokit_s": spent}
            print(f"| {phase} | {gflop:.1f} | {floor:.2f} | {spent:.2f} | {floor / spent:.0%} | "
                  f"{trl.get(phase, 0.0):.2f} |")  # fmt: skip
        step = results[name]["grpokit"]["step_median"]
        print(f"| step | | {total_floor:.2f} | {step:.2f} | {total_floor / step:.0%} | "
              f"{results[name]['trl']['step_median']:.2f} |")  # fmt: skip
        report[name]["step"] = {"roofline_s": total_floor, "grpokit_s": step}
    rates = {f"{m}x{k}x{n}": round(r / 1e9, 1) for (m, k, n), r in sorted(cache.items())}
    print("\nmeasured matmul GFLOP/s at [m x k] x [k x n]:", rates)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"phases": report, "gflops": rates}, f, indent=2)


if __name__ == "__main__":
    main()
