"""One decode step of the fast sampler against the same step at another git revision, on
SmolLM2-135M-Instruct: per-step time side by side, and the largest difference of their logits.

Both decoders (``NativeDecoder`` as of ``--against``, loaded from ``git show``, and as in the working tree)
start from one prefill and are fed the same tokens (the old decoder's greedy choice), their calls alternated
step by step, so machine noise falls on both alike. Midway a quarter of the rows leave the decode batch
(``keep``; with 4 rows or more), so the steps after it run the compacted path. Each shape reports the
median step time of each before and after the rows leave.

    python benchmarks/decode_against.py --against REV [--model DIR] [--bf16] [--unpacked] [--steps 48]
        [--shapes 1x1 1x2 1x4 1x8 2x8 4x8 4x16]

A shape PxG: P prompts of 100-139 tokens, G rows each. Packing is on for every shape where the processor
allows it (``packs_weights``), off with ``--unpacked``.

Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SOURCE = "src/grpokit/rollout/native_decode.py"


def module_at(revision: str):
    """``grpokit.rollout.native_decode`` as of ``revision``, as a module of its own."""
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True)
    text = subprocess.run(
        ["git", "show", f"{revision}:{SOURCE}"], cwd=root.stdout.strip(), capture_output=True, text=True
    )
    if text.returncode != 0:
        sys.exit(f"git show {revision}:{SOURCE} failed: {text.stderr.strip()}")
    path = os.path.join(tempfile.mkdtemp(), "native_decode_at_revision.py")
    with open(path, "w") as f:
        f.write(text.stdout)
    spec = importlib.util.spec_from_file_location("native_decode_at_revision", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", required=True, help="the git revision to compare with (e.g. HEAD~1)")
    ap.add_argument("--model", default=os.path.join(tempfile.gettempdir(), "grpokit-bench", "smollm2"))
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast over the float32 weights")
    ap.add_argument("--unpacked", action="store_true", help="products on the weights as they are")
    ap.add_argument("--steps", type=int, default=48, help="decode steps per shape (4 not timed)")
    ap.add_argument("--shapes", nargs="+", default=["1x1", "1x2", "1x4", "1x8", "2x8", "4x8", "4x16"])
    a = ap.parse_args()
    from smollm2 import prepare
    from transformers import AutoModelForCausalLM

    from grpokit.rollout import native_decode
    from grpokit.rollout.fast import FastSampler

    modules = {"against": module_at(a.against), "tree": native_decode}
    for module in modules.values():  # pack however short the call (where the processor allows it)
        module.packing_pays = lambda dtype, rows, max_new, capability=None: True
        if a.unpacked:
            module.packs_weights = lambda device, dtype: False
    model = AutoModelForCausalLM.from_pretrained(prepare(a.model), dtype=torch.float32)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if a.bf16 else contextlib.nullcontext()
    precision = "bf16 autocast" if a.bf16 else "fp32"
    print(
        f"SmolLM2-135M-Instruct, {precision}{', unpacked' if a.unpacked else ''}, {torch.get_num_threads()}"
        f" threads, CPU capability {torch.backends.cpu.get_cpu_capability()}, {a.steps} decode steps; "
        f"{a.against} against the working tree, ms per decode step (median)"
    )
    print(f"{'shape':>6} {'rows':>5} | {a.against:>10} {'tree':>8} {'ratio':>6} | after a quarter left: "
          f"{'rows':>4} {a.against:>10} {'tree':>8} {'ratio':>6} | max |logit diff|")  # fmt: skip
    leave_at = a.steps // 2
    for shape in a.shapes:
        num_prompts, group = (int(n) for n in shape.split("x"))
        prompts = [list(range(100 + 7 * k, 200 + 13 * k)) for k in range(num_prompts)]
        rows = num_prompts * group
        with torch.inference_mode(), autocast:
            pre = FastSampler(model)._prefill(prompts, torch.device("cpu"), keep_hf_cache=False, images=None)
            decoders = {n: m.NativeDecoder(model, pre, group, a.steps + 1) for n, m in modules.items()}
            times = {n: ([], []) for n in decoders}
            tokens = pre.last_logits.repeat_interleave(group, dim=0).argmax(-1)
            worst = 0.0
            for t in range(a.steps):
                if t == leave_at and rows >= 4:  # every 4th row leaves
                    running = torch.arange(len(tokens)) % 4 != 1
                    orders = [d.keep(running, t - 1) for d in decoders.values()]
                    tokens = tokens[orders[0]]
                logits = {}
                for name in list(decoders)[:: 1 if t % 2 else -1]:
                    begin = time.perf_counter()
                    logits[name] = decoders[name](tokens, t)
                    times[name][t >= leave_at].append(time.perf_counter() - begin)
                worst = max(worst, (logits["against"] - logits["tree"]).abs().max().item())
                tokens = logits["against"].argmax(-1)
        before = {n: statistics.median(ts[0][4:]) * 1e3 for n, ts in times.items()}
        after = {n: statistics.median(ts[1]) * 1e3 for n, ts in times.items()}
        left = f"{len(tokens):>4} {after['against']:>10.1f} {after['tree']:>8.1f} "
        left += f"{after['tree'] / after['against']:>6.3f}"
        print(
            f"{shape:>6} {rows:>5} | {before['against']:>10.1f} {before['tree']:>8.1f} "
            f"{before['tree'] / before['against']:>6.3f} | {'':>21}{left} | {worst:.2e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
