"""Where the training passes' time goes: the update's forward and backward and the reference's no-grad pass
over one W4-shaped micro-batch (``saved_activations.w4_batch``: 2 groups of 8, prompts of 165 and 90
tokens, completions of 2-256, packed, shared prefix) of SmolLM2-135M-Instruct with the trainer's lean
layers, timed on their own and then under ``torch.profiler``, operators' own CPU time summed by kind:

- products: ``aten::mm`` / ``addmm`` / ``addmm_`` / ``bmm`` and oneDNN's ``mkldnn::_linear_pointwise``
  (projections, MLP, LM head chunks, and their gradients; the float32 ones oneDNN's where
  ``grpokit.models.cpu_linear`` runs);
- attention: ``scaled_dot_product_*`` and softmax, forward and backward;
- casts: ``copy_`` / ``_to_copy`` (under autocast: every weight and activation cast to bf16, and back);
- element-wise and the rest: norms, rotary, SiLU, residuals, the log-softmax of the head, indexing.

    python benchmarks/pass_profile.py [--model DIR] [--bf16] [--top N]
    python benchmarks/pass_profile.py [--bf16] --timed N [--every-block-kept]

``--timed N`` profiles nothing: it times each pass N times (after a warm-up) as the trainer runs them, under
the trainer's CPU runtime (``grpokit.parallel.cpu_runtime`` at ``GRPOConfig``'s defaults: blocks from 1 MiB
mapped fresh, the backward's from the heap, the update starting from a trimmed heap) and the update inside
``recomputed_in_backward``, and prints a hash of the log-probs, the
entropy's sum and the LM head's gradient norm, so that two commits can be compared side by side
(``PYTHONPATH=<other checkout>/src``). The update's forward and backward are timed apart too.
``--every-block-kept`` runs them with every block from the heap, never trimmed
(``cpu_memory_reuse_below=None``): what the fresh pages cost the passes.

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
    "products": ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "mkldnn::_linear_pointwise"),
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
    ap.add_argument("--timed", type=int, default=0, help="time each pass N times as the trainer runs it")
    ap.add_argument("--every-block-kept", action="store_true", help="--timed, cpu_memory_reuse_below=None")
    a = ap.parse_args()
    if a.timed:
        timed(a.model, a.bf16, a.timed, a.every_block_kept)
        return
    from common import print_operator_time
    from saved_activations import G, w4_batch
    from smollm2 import prepare
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    from grpokit.train.forward import completion_logprobs, no_grad_logprobs

    model = AutoModelForCausalLM.from_pretrained(prepare(a.model), dtype=torch.float32)
    as_the_trainer_loads_it(model)
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


def as_the_trainer_loads_it(model: torch.nn.Module) -> None:
    """The layers ``load_policy`` gives a float32 policy at GRPOConfig's defaults: oneDNN's float32 linears
    (on x86 CPUs; absent from grpokit before them, which this script also times) and the lean MLPs and
    norms."""
    from grpokit.models.lean_layers import use_lean_layers

    try:
        from grpokit.models.cpu_linear import use_onednn_linears
    except ImportError:
        pass
    else:
        use_onednn_linears(model)
    use_lean_layers(model)


def timed(model_dir: str, bf16: bool, repeats: int, every_block_kept: bool = False) -> None:
    """``--timed``: the update's forward + backward and the reference pass, ``repeats`` times each in turn
    (``every_block_kept``: under ``cpu_memory_reuse_below=None``)."""
    import hashlib

    from saved_activations import G, w4_batch
    from smollm2 import prepare
    from transformers import AutoModelForCausalLM

    import grpokit
    from grpokit.config import GRPOConfig
    from grpokit.models.recompute import recomputed_in_backward
    from grpokit.parallel import cpu_runtime
    from grpokit.train.forward import completion_logprobs, no_grad_logprobs

    kept = {"cpu_memory_reuse_below": None} if every_block_kept else {}
    config = GRPOConfig(output_dir=tempfile.gettempdir(), **kept)  # (the config writes nothing there)
    cpu_runtime.apply_cpu_runtime(config, cpu=True)
    # (the runtime of the commit timed: one without the backward's heap runs its backward as it did)
    blocks_from_heap = getattr(cpu_runtime, "blocks_from_heap", contextlib.nullcontext)
    trim_heap = getattr(cpu_runtime, "trim_heap", lambda: None)
    model = AutoModelForCausalLM.from_pretrained(prepare(model_dir), dtype=torch.float32)
    as_the_trainer_loads_it(model)
    batch = w4_batch(model.config.vocab_size)
    rows = len(batch[0])
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    precision = "bf16 autocast" if bf16 else "fp32"
    blocks = "every block kept" if every_block_kept else "default"
    print(f"grpokit from {os.path.dirname(grpokit.__file__)}, {precision}, blocks: {blocks}")
    seconds: dict[str, list[float]] = {"update": [], "  forward": [], "  backward": [], "reference": []}

    def update() -> tuple[torch.Tensor, torch.Tensor, float]:
        trim_heap()
        begin = time.perf_counter()
        with autocast(), recomputed_in_backward():
            lp, ent = completion_logprobs(
                model, *batch, num_generations=G, padding_free=True, with_entropy=True
            )
        seconds["  forward"].append(time.perf_counter() - begin)
        begin = time.perf_counter()
        with blocks_from_heap():
            (lp.sum() + ent.sum()).backward()  # (after autocast is left, as the trainer calls it)
        seconds["  backward"].append(time.perf_counter() - begin)
        head_grad = float(model.get_output_embeddings().weight.grad.norm())
        model.zero_grad(set_to_none=True)
        return lp.detach(), ent.detach(), head_grad

    def reference() -> torch.Tensor:
        with autocast():
            return no_grad_logprobs(
                model, *batch, num_generations=G, micro_batch_size=rows, padding_free=True
            )

    update(), reference()  # warm-up
    for times in seconds.values():
        times.clear()
    for _ in range(repeats):
        begin = time.perf_counter()
        lp, ent, head_grad = update()
        seconds["update"].append(time.perf_counter() - begin)
        begin = time.perf_counter()
        ref = reference()
        seconds["reference"].append(time.perf_counter() - begin)
    for name, times in seconds.items():
        print(f"  {name}: " + " ".join(f"{t:.2f}" for t in times) + " s")
    digest = hashlib.sha1(lp.numpy().tobytes() + ref.numpy().tobytes()).hexdigest()[:12]
    print(f"  log-probs (update, reference) {digest}, entropy sum {float(ent.sum()):.6f}")
    print(f"  the LM head's gradient norm {head_grad:.6f}")


if __name__ == "__main__":
    main()
