"""Where the training passes' time goes: the update's forward and backward and the reference's no-grad pass
over one W4-shaped micro-batch (``saved_activations.w4_batch``: 2 groups of 8, prompts of 165 and 90
tokens, completions of 2-256, packed, shared prefix) of SmolLM2-135M-Instruct with the trainer's lean
layers, timed on their own and then under ``torch.profiler``, operators' own CPU time summed by kind:

- products: ``aten::mm`` / ``addmm`` / ``bmm`` (projections, MLP, LM head chunks, and their gradients);
- attention: ``scaled_dot_product_*`` and softmax, forward and backward;
- casts: ``copy_`` / ``_to_copy`` (under autocast: every weight and activation cast to bf16, and back);
- element-wise and the rest: norms, rotary, SiLU, residuals, the log-softmax of the head, indexing.

    python benchmarks/pass_profile.py [--model DIR] [--bf16] [--top N]

Run it alone on the machine. The profiler adds its own overhead: compare the kinds' shares.
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

KINDS = {
    "products": ("aten::mm", "aten::addmm", "aten::bmm"),
    "attention": (
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
        "aten::_softmax",
        "aten::_softmax_backward_data",
    ),
    "casts": ("aten::copy_", "aten::_to_copy"),
}
"""Operator names summed into each kind (self CPU time); every other operator is element-wise or the rest."""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(tempfile.gettempdir(), "grpokit-bench", "smollm2"))
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast over the float32 weights")
    ap.add_argument("--top", type=int, default=0, help="also list the operators with the most own time")
    a = ap.parse_args()
    from common import print_operator_time
    from saved_activations import G, w4_batch
    from smollm2 import prepare
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    from grpokit.models.lean_layers import use_lean_layers
    from grpokit.train.forward import completion_logprobs, no_grad_logprobs

    model = AutoModelForCausalLM.from_pretrained(prepare(a.model), dtype=torch.float32)
    use_lean_layers(model)
    batch = w4_batch(model.config.vocab_size)
    rows = len(batch[0])
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if a.bf16 else contextlib.nullcontext()
    print(
        f"SmolLM2-135M-Instruct, {'bf16 autocast' if a.bf16 else 'fp32'}, {torch.get_num_threads()} threads"
    )
    print(f"{rows} rows, {int(batch[3].sum())} real completion tokens")

    def update() -> None:
        with autocast:
            lp, ent = completion_logprobs(
                model, *batch, num_generations=G, padding_free=True, with_entropy=True
            )
        (lp.sum() + ent.sum()).backward()
        model.zero_grad(set_to_none=True)

    def reference() -> None:
        with autocast:
            no_grad_logprobs(model, *batch, num_generations=G, micro_batch_size=rows, padding_free=True)

    for name, run in (("forward + backward", update), ("no-grad pass", reference)):
        run()  # warm-up
        begin = time.perf_counter()
        run()
        seconds = time.perf_counter() - begin
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
        events = prof.key_averages()
        print(f"{name}: {seconds:.2f} s unprofiled; profiled:")
        print_operator_time(events, KINDS, "element-wise and the rest", a.top)


if __name__ == "__main__":
    main()
