"""Roofline of the benchmark's GRPO step: matmul FLOPs per phase from the model's config, this machine's
measured matmul rate at those shapes, and the fraction of it each phase of a measured run achieves.

FLOPs count matrix products only (2 m n k each), as grpokit computes them:
- generate: each distinct prompt prefilled once (LM head at its last position only), then one decode step
  per new token for every row (backbone, LM head, attention over the context so far);
- log-prob passes (reference, old policy, training forward): the shared-prefix forward, so each group's
  prompt runs once and the completions attend to it; the LM head only at completion positions (no old-policy
  pass when the run took pi_old's log-probs from the sampler: ``reuse_sampler_logprobs``, old_logps ~0 s);
- backward: twice the training forward, plus one more LM-head product per completion token (grpokit
  recomputes each logits chunk instead of storing [M, V] logits).
Attention is 4 x context x hidden per token and layer (scores and values). Element-wise work (norms,
rotary, softmax, sampling) is not counted: the gap between a phase's time and its roofline time is that work,
framework overhead and matmuls running below the measured rate.

    python benchmarks/roofline.py --results benchmarks/results/summary-2core.json
    python benchmarks/roofline.py --results RUN.json --precision bf16     # its grpokit-bf16, trl-bf16 sides
    python benchmarks/roofline.py --results none --workloads W1,W2         # floors only, no run needed

prints one table per workload (markdown). The matmul rates are measured here on torch's current threads, each
product's weight read from memory as in a pass over the model (``COLD_BYTES``); run it on an otherwise idle
machine.

Precision. The processor's bf16 support is printed first (``grpokit.parallel.hardware``: AMX-BF16 or Arm
BF16 matrix units, ``avx512_bf16``; on CUDA the compute capability). The rates are measured in float32 and
bfloat16 (and float16 on GPUs and on CPUs with AMX-FP16 or AVX512-FP16) at every shape of the step. The
main table's floor is at the rates of ``--precision``: the dtype the run's matmuls execute in (fp32 for
the default run; bf16 for ``bf16=true``, where autocast runs every matmul in bf16). A second table per
workload gives each phase's floor in every measured dtype, so that an fp32 run shows what bf16 could reach.
``--device cuda`` measures on the GPU instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
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
    return step_phases(shape, wl, generate, forward, rows * new)


def step_phases(
    shape: Shape, wl: Workload, generate: list, forward: list, scored: int
) -> dict[str, list[tuple[int, int, int, int]]]:
    """A step's phases from its generation and one log-prob forward (``scored`` completion tokens at the
    LM head): the reference pass (beta > 0), the old-policy pass (mu > 1), mu training forwards, and their
    backward (twice the forward, plus the LM-head chunks it recomputes)."""
    mu = wl.num_iterations
    phases = {"generate": generate}
    if wl.beta > 0:
        phases["ref_logps"] = forward
    if mu > 1:
        phases["old_logps"] = forward
    phases["policy_forward"] = [(c * mu, m, k, n) for c, m, k, n in forward]
    recompute = (mu, scored, shape.hidden, shape.vocab)  # the LM-head chunks the backward recomputes
    phases["backward"] = [*[(2 * c * mu, m, k, n) for c, m, k, n in forward], recompute]
    return phases


def real_phase_products(
    shape: Shape, wl: Workload, prompts: list[int], completions: list[int]
) -> dict[str, list[tuple[int, int, int, int]]]:
    """``phase_products`` over real tokens only, for a step whose distinct prompts have ``prompts`` tokens
    and whose rows (``num_generations`` per prompt, in order) ``completions`` tokens: what the step must
    compute when no padding runs (the floor "over real tokens").

    Generation: each prompt prefilled once, then decode call t feeds token t of the rows still running
    (those with more than t + 1 tokens); its products run at the rows' real count (in fours, to bound the
    shapes measured). Log-prob passes: each group's prompt once, each row's completion tokens but the last,
    the LM head at every completion token. Backward: as ``phase_products``."""
    group, h = wl.num_generations, shape.hidden
    rows_prompt = [prompts[i // group] for i in range(len(completions))]
    fed = [max(c - 1, 0) for c in completions]  # completion tokens a pass runs (the last predicts nothing)

    def backbone(m: int, times: int = 1) -> list[tuple[int, int, int, int]]:
        return [(shape.layers * times, m, k, n) for k, n in shape.backbone_matrices()] if m else []

    def attention(queries: int, context: float) -> list[tuple[int, int, int, int]]:
        return [(2 * shape.layers, queries, h, max(1, round(context)))] if queries else []

    prompt_tokens = sum(prompts)
    prompt_context = sum(p * p / 2 for p in prompts) / max(prompt_tokens, 1)  # causal: mean context p/2
    completion_tokens = sum(fed)
    completion_context = sum(c * (p + c / 2) for p, c in zip(rows_prompt, fed)) / max(completion_tokens, 1)
    generate = backbone(prompt_tokens) + attention(prompt_tokens, prompt_context)
    generate += [(1, len(prompts), h, shape.vocab)]  # the prefill's last-position logits
    running: dict[int, int] = {}  # rows in a decode call (rounded up to a multiple of 4) -> calls
    for t in range(max(completions) - 1):
        n = sum(1 for c in completions if c > t + 1)
        running[-(-n // 4) * 4] = running.get(-(-n // 4) * 4, 0) + 1
    for n, calls in sorted(running.items()):
        generate += [*backbone(n, calls), (calls, n, h, shape.vocab)]
    generate += attention(completion_tokens, completion_context)
    forward = backbone(prompt_tokens) + attention(prompt_tokens, prompt_context)
    forward += backbone(completion_tokens) + attention(completion_tokens, completion_context)
    forward += [(1, sum(completions), h, shape.vocab)]  # LM head at completion positions only
    return step_phases(shape, wl, generate, forward, sum(completions))


PRECISIONS = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""``--precision`` -> the torch dtype the run's matmuls execute in."""


COLD_BYTES = 256 << 20
"""Bytes of distinct copies of a product's weight that a rate's calls take in turn: more than a cache holds,
so that each call reads its weight from memory, as a pass over the model does (SmolLM2-135M's weights are
540 MB in float32, 270 in bf16; the L3 of the processors measured here holds 32 MiB). On one weight called
over and over the product finds it in the cache: a decode step's products with a few rows, which read each
weight once, measured up to 2.4x faster that way (4 rows; 1.4-1.5x with 32) than a decode step runs them."""


class Rates:
    """Measured torch.mm rates at [m, k] x [k, n] per dtype on one device, each shape measured once, with the
    weight ([k, n]) read from memory at each call (``COLD_BYTES``) and the input [m, k] as it comes."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self.cache: dict[tuple[str, int, int, int], float] = {}

    def __call__(self, precision: str, m: int, k: int, n: int) -> float:
        """FLOP/s of the product [m, k] x [k, n] in ``precision``: the fastest of the layouts a linear layer
        can compute it in (``a @ b`` with b stored [k, n]; ``a @ w.T`` with w stored [n, k], as ``F.linear``;
        ``(w @ a.T).T``; on a CPU where the decode packs its weights, oneDNN's product on w packed,
        ``native_decode.packs_weights``), each the best of 5 repeats of ~0.2 GFLOP, each call on the next of
        the weight's copies (``COLD_BYTES``). BLAS libraries differ by layout: MKL's float32 product with a
        few rows and a wide output runs several times faster as ``w @ a.T``, and oneDNN's on a packed weight
        faster still."""
        import torch

        from grpokit.rollout.native_decode import pack_weight, packed_linear, packs_weights

        key = (precision, m, k, n)
        if key not in self.cache:
            dtype = getattr(torch, PRECISIONS[precision])
            a = torch.randn(m, k, device=self.device).to(dtype)
            b = torch.randn(k, n, device=self.device).to(dtype)
            copies = -(-COLD_BYTES // b.nbytes)
            bs = [b] + [b.clone() for _ in range(copies - 1)]  # [k, n] each, in memory of its own
            ws = [x.T.contiguous() for x in bs]  # [n, k]
            layouts = [
                _in_turn(bs, lambda b: torch.mm(a, b)),
                _in_turn(ws, lambda w: torch.mm(a, w.T)),
                _in_turn(ws, lambda w: torch.mm(w, a.T)),
            ]
            if packs_weights(a.device, dtype):
                packed = [pack_weight(w, m) for w in ws]
                layouts.append(_in_turn(packed, lambda p: packed_linear(a, p)))
            flops = 2 * m * k * n
            self.cache[key] = flops / min(self._seconds(product, flops) for product in layouts)
        return self.cache[key]

    def _seconds(self, product, flops: int) -> float:
        """Seconds of one call of ``product``: the best of 5 repeats of ~0.2 GFLOP, after one warm-up call
        (with 3, [64 x 576] x [576 x 1536] once measured 211 GFLOP/s, where four other runs gave 368-385)."""
        import torch

        sync = torch.cuda.synchronize if self.device.startswith("cuda") else (lambda: None)
        product()
        sync()
        reps = max(1, int(2e8 / flops))
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(reps):
                product()
            sync()
            best = min(best, (time.perf_counter() - start) / reps)
        return best

    def gflops(self, precision: str) -> dict[str, float]:
        """``{"MxKxN": GFLOP/s}`` of the shapes measured in ``precision``."""
        rows = sorted((shape, r) for (p, *shape), r in self.cache.items() if p == precision)
        return {"x".join(map(str, shape)): round(r / 1e9, 1) for shape, r in rows}


def _in_turn(weights: list, product):
    """A call of ``product(weight)`` on the next of ``weights`` at each call (round robin)."""
    turn = itertools.count()
    return lambda: product(weights[next(turn) % len(weights)])


def roofline(products: list[tuple[int, int, int, int]], rates: Rates, precision: str) -> tuple[float, float]:
    """(GFLOP, seconds at the measured rates of ``precision``) of a phase's products."""
    flops = sum(2 * c * m * k * n for c, m, k, n in products)
    seconds = sum(2 * c * m * k * n / rates(precision, m, k, n) for c, m, k, n in products)
    return flops / 1e9, seconds


def median_floor(
    by_step: list[dict[str, list[tuple[int, int, int, int]]]], phase: str, rates: Rates, precision: str
) -> tuple[float, float]:
    """(GFLOP, seconds) of ``phase``: the median over the timed steps of each step's ``roofline``."""
    per_step = [roofline(phases[phase], rates, precision) for phases in by_step]
    return statistics.median(g for g, _ in per_step), statistics.median(s for _, s in per_step)


def measured_precisions(device: str, support) -> list[str]:
    """fp32; bf16 where the device has some bf16 instruction (a CPU without any emulates it, two orders of
    magnitude slower: measuring the step's shapes would take hours); fp16 on GPUs and on CPUs with
    half-precision matrix or vector units."""
    cuda = device.startswith("cuda")
    half = cuda or {"amx_fp16", "avx512_fp16"} & set(support.features)
    bf16 = cuda or bool(support.features)
    return ["fp32", *(["bf16"] if bf16 else []), *(["fp16"] if half else [])]


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
    import torch

    from grpokit.parallel.hardware import bf16_support

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="benchmarks/results/summary-2core.json",
                    help="a bench_grpo.py summary; 'none': floors only, for --workloads")  # fmt: skip
    ap.add_argument("--workloads", default=None, help="e.g. W1,W2 (default: those in --results)")
    ap.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32",
                    help="the dtype the run's matmuls execute in (bf16: a bf16=true run)")  # fmt: skip
    ap.add_argument("--device", default="cpu", help="cpu, or cuda / cuda:N")
    ap.add_argument("--out", default=None, help="also write the tables' numbers as JSON here")
    ap.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "grpokit-bench"))
    args = ap.parse_args()
    results, replayed = {}, False
    if args.results != "none":
        with open(args.results) as f:
            summary = json.load(f)
        results = summary["workloads"]
        replayed = summary["settings"].get("fixed_samples", False)  # bench_grpo.py --fixed-samples
    names = args.workloads.split(",") if args.workloads else list(results)
    support = bf16_support(args.device)
    precisions = measured_precisions(args.device, support)
    if args.precision not in precisions:
        precisions.append(args.precision)
    print(f"{support.describe()}; torch {torch.__version__}, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads; "
          f"floors at {args.precision} rates")  # fmt: skip
    rates, report = Rates(args.device), {}
    for name, wl in WORKLOADS.items():
        if name not in names:
            continue
        folder = model_dir(wl.model, args.work_dir)
        shape = model_shape(folder)
        wl = dataclasses.replace(wl, prompt_len=prompt_tokens(wl, folder))
        measured = results.get(name)
        if measured:  # the sides of that precision (bench_grpo.py --sides ...,grpokit-bf16,trl-bf16)
            suffix = "" if args.precision == "fp32" else f"-{args.precision}"
            g_side = f"grpokit{suffix}" if f"grpokit{suffix}" in measured else "grpokit"
            t_side = f"trl{suffix}" if f"trl{suffix}" in measured else "trl"
            measured = {
                "grpokit": measured[g_side],
                **({"trl": measured[t_side]} if t_side in measured else {}),
            }
            print(f"\n{name}: grpokit side {g_side!r}, TRL side {t_side!r}")
        grpokit = measured["grpokit"]["phases"] if measured else {}
        trl = measured["trl"]["phases"] if measured and "trl" in measured else {}
        print(f"\n{name}: {wl}\n")
        print(f"| phase | GFLOP | roofline s ({args.precision}) | grpokit s | achieved | TRL s |")
        print("|---|---|---|---|---|---|")
        total_floor = total_time = 0.0
        report[name] = {}
        steps = (measured or {}).get("grpokit", {}).get("lengths")
        if wl.eos and not steps:
            raise SystemExit(f"{name}: real lengths need --results with the runs' lengths (bench_grpo.py)")
        if steps:  # real lengths: each timed step's products over its real tokens
            by_step = [real_phase_products(shape, wl, s["prompts"], s["completions"]) for s in steps]
            print(f"floors over real tokens: completion tokens per timed step "
                  f"{[sum(s['completions']) for s in steps]}, prompts {steps[0]['prompts']}")  # fmt: skip
        else:
            by_step = [phase_products(shape, wl)]
        if measured and grpokit.get("policy_forward", 0.0) == 0.0:  # the trainer times the update as one
            for phases in by_step:
                phases["backward"] = phases.pop("policy_forward") + phases["backward"]
            trl = {**trl, "backward": trl.get("policy_forward", 0.0) + trl.get("backward", 0.0)}
        floors: dict[str, dict[str, float]] = {}
        if measured and "old_logps" in by_step[0] and grpokit.get("old_logps", 0.0) < 0.01:
            # the trainer took pi_old's log-probs from the sampler (reuse_sampler_logprobs): no pass to count
            for phases in by_step:
                del phases["old_logps"]
            print(f"| old_logps | - (the sampler's) | - | {grpokit.get('old_logps', 0.0):.2f} | - | "
                  f"{trl.get('old_logps', 0.0):.2f} |")  # fmt: skip
        if replayed:  # the sides replayed recorded completions: no generation to count
            for phases in by_step:
                del phases["generate"]
            print(f"| generate | - (replayed: --fixed-samples) | - | {grpokit.get('generate', 0.0):.2f} "
                  f"| - | {trl.get('generate', 0.0):.2f} |")  # fmt: skip
        for phase in by_step[0]:
            # the median over the timed steps of each step's floor, as the times are medians over those steps
            floors[phase] = {p: median_floor(by_step, phase, rates, p)[1] for p in precisions}
            gflop, floor = median_floor(by_step, phase, rates, args.precision)
            spent = grpokit.get(phase, 0.0)
            total_floor, total_time = total_floor + floor, total_time + spent
            report[name][phase] = {"gflop": gflop, "roofline_s": floor, "grpokit_s": spent,
                                   "roofline_s_by_precision": floors[phase]}  # fmt: skip
            achieved = f"{floor / spent:.0%}" if spent > 0 else "-"
            print(f"| {phase} | {gflop:.1f} | {floor:.2f} | {spent:.2f} | {achieved} | "
                  f"{trl.get(phase, 0.0):.2f} |")  # fmt: skip
        if measured:
            step = measured["grpokit"]["step_median"]
            trl_step = measured["trl"]["step_median"] if "trl" in measured else 0.0
            print(f"| step | | {total_floor:.2f} | {step:.2f} | {total_floor / step:.0%} | {trl_step:.2f} |")
            report[name]["step"] = {"roofline_s": total_floor, "grpokit_s": step}
        else:
            print(f"| step | | {total_floor:.2f} | - | - | - |")
            report[name]["step"] = {"roofline_s": total_floor}
        print("\nfloor by precision (s):\n")
        print("| phase | " + " | ".join(precisions) + " | bf16 / fp32 |")
        print("|---|" + "---|" * (len(precisions) + 1))
        for phase, by in [
            *floors.items(),
            ("step", {p: sum(f[p] for f in floors.values()) for p in precisions}),
        ]:
            cells = " | ".join(f"{by[p]:.2f}" for p in precisions)
            ratio = f"{by['bf16'] / by['fp32']:.2f}" if "bf16" in by else "-"
            print(f"| {phase} | {cells} | {ratio} |")
    print(f"\nmeasured matmul GFLOP/s at [m x k] x [k x n], {args.precision}:", rates.gflops(args.precision))
    for precision in precisions:
        if precision != args.precision:
            print(f"{precision}:", rates.gflops(precision))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({
                "precision": args.precision, "device": args.device, "bf16_support": support.describe(),
                "matrix_units": support.matrix_units, "features": list(support.features),
                "phases": report, "gflops": rates.gflops(args.precision),
                "gflops_by_precision": {p: rates.gflops(p) for p in precisions},
            }, f, indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
