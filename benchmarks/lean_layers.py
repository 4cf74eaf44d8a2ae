"""The update's pass with ``transformers``' MLPs and norms against the lean ones (``lean_activations``),
side by side, on SmolLM2-135M-Instruct: the lean ones outside the update's ``recomputed_in_backward`` block
("lean") and inside it, as the update runs them ("lean, made again": the norms' and the packed attention's
outputs kept as recipes).

One W4-shaped micro-batch (``saved_activations.w4_batch``: 2 groups of 8, prompts of 165 and 90 tokens,
completions of 2-256, packed, shared prefix, with entropy): what autograd saves for the backward (each
storage once, parameters left out) and the seconds of ``completion_logprobs``' forward and backward, the
three alternated, one untimed run each first. The lean model is a copy of the other.

    python benchmarks/lean_layers.py [--model DIR] [--bf16] [--repeats 4]

Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(tempfile.gettempdir(), "grpokit-bench", "smollm2"))
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast over the float32 weights")
    ap.add_argument("--repeats", type=int, default=4, help="timed runs of each, alternated")
    a = ap.parse_args()
    from saved_activations import G, w4_batch
    from smollm2 import prepare
    from transformers import AutoModelForCausalLM

    from grpokit.models import recompute
    from grpokit.models.lean_layers import use_lean_layers
    from grpokit.train.forward import completion_logprobs

    plain = AutoModelForCausalLM.from_pretrained(prepare(a.model), dtype=torch.float32)
    lean = copy.deepcopy(plain)
    print(f"lean modules: {use_lean_layers(lean)}")
    models = {"transformers": plain, "lean": lean, "lean, made again": lean}
    blocks = {"lean, made again"}
    batch = w4_batch(plain.config.vocab_size)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if a.bf16 else contextlib.nullcontext()
    print(
        f"SmolLM2-135M-Instruct, {'bf16 autocast' if a.bf16 else 'fp32'}, {torch.get_num_threads()} threads; "
        f"{len(batch[0])} rows, {int(batch[3].sum())} real completion tokens"
    )

    def forward(model, name, observe=None):
        block = recompute.recomputed_in_backward(observe) if name in blocks else contextlib.nullcontext()
        with autocast, block:
            return completion_logprobs(model, *batch, num_generations=G, padding_free=True, with_entropy=True)

    def update(model, name) -> None:
        lp, ent = forward(model, name)
        (lp.sum() + ent.sum()).backward()
        model.zero_grad(set_to_none=True)

    grads = {}
    for name, model in models.items():
        lp, ent = forward(model, name)
        (lp.sum() + ent.sum()).backward()
        grads[name] = (lp.detach(), [p.grad.clone() for p in model.parameters()])
        model.zero_grad(set_to_none=True)
        mib = saved_mib(model, functools.partial(forward, name=name), name in blocks)
        print(f"{name}: saved for the backward {mib:.0f} MiB")
    (lp_plain, g_plain), (lp_lean, g_lean), (lp_again, g_again) = grads.values()
    worst = max(float((x - y).abs().max() / y.abs().max().clamp(min=1e-30)) for x, y in zip(g_lean, g_plain))
    print(
        f"log-probs equal: {torch.equal(lp_plain, lp_lean)}; largest gradient difference {worst:.1e} of a max"
    )
    same = torch.equal(lp_again, lp_lean) and all(torch.equal(x, y) for x, y in zip(g_again, g_lean))
    print(f"made again against lean: log-probs and every gradient equal bit for bit: {same}")
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(a.repeats):
        for name, model in models.items():
            begin = time.perf_counter()
            update(model, name)
            times[name].append(time.perf_counter() - begin)
    for name, values in times.items():
        runs = ", ".join(f"{t:.2f}" for t in values)
        print(f"{name}: forward + backward {statistics.median(values):.2f} s (runs {runs})")
    ratio = statistics.median(times["lean"]) / statistics.median(times["transformers"])
    print(f"lean / transformers: {ratio:.3f}")
    ratio = statistics.median(times["lean, made again"]) / statistics.median(times["lean"])
    print(f"lean, made again / lean: {ratio:.3f}")


def saved_mib(model: torch.nn.Module, forward, block: bool) -> float:
    """MiB of the distinct tensors autograd saves in ``forward(model)``, parameters left out; ``block``: the
    forward opens the update's block, which shows ``count`` what it keeps (``observe``)."""

    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def count(tensor: torch.Tensor, saved) -> torch.Tensor:
        pointer = tensor.untyped_storage().data_ptr()
        if pointer not in parameters and saved is tensor:
            seen[pointer] = tensor.untyped_storage().nbytes()
        return tensor

    if block:  # the block shows what it keeps itself
        lp, ent = forward(model, observe=count)
    else:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: count(t, t), lambda t: t):
            lp, ent = forward(model)
    del lp, ent
    return sum(seen.values()) / 2**20


if __name__ == "__main__":
    main()
