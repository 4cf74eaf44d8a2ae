"""Where the training passes' time goes: the update's forward and backward and the reference's no-grad pass
over one W4-shaped micro-batch (``saved_activations.w4_batch``: 2 groups of 8, prompts of 165 and 90
tokens, completions of 2-256, packed, shared prefix) of SmolLM2-135M-Instruct with the trainer's lean
layers, as the trainer runs them (``TrainerPasses``; below), timed on their own and then under
``torch.profiler``, operators' own CPU time summed by kind:

- products: ``aten::mm`` / ``addmm`` / ``addmm_`` / ``bmm`` and oneDNN's ``mkldnn::_linear_pointwise``
  (projections, MLP, LM head chunks, and their gradients; the float32 ones oneDNN's where
  ``grpokit.models.cpu_linear`` runs);
- attention: ``scaled_dot_product_*`` and softmax, forward and backward;
- casts: ``copy_`` / ``_to_copy`` (under autocast: every weight and activation cast to bf16, and back);
- element-wise and the rest: norms, rotary, SiLU, residuals, the log-softmax of the head, indexing.

    python benchmarks/pass_profile.py [--model DIR] [--bf16] [--top N] [--workload W3]
    python benchmarks/pass_profile.py [--bf16] --timed N [--every-block-kept] [--workload W3]
    python benchmarks/pass_profile.py [--bf16] --breakdown N [--workload W3]

``--timed N`` profiles nothing: it times each pass N times (after a warm-up) as the trainer runs them, under
the trainer's CPU runtime (``grpokit.parallel.cpu_runtime`` at ``GRPOConfig``'s defaults: blocks from 1 MiB
mapped fresh, the backward's from the heap, the update starting from a trimmed heap) and the update inside
``recomputed_in_backward``, and prints a hash of the log-probs, the
entropy's sum and the LM head's gradient norm, so that two commits can be compared side by side
(``PYTHONPATH=<other checkout>/src``). The update's forward and backward are timed apart too.
``--every-block-kept`` runs them with every block from the heap, never trimmed
(``cpu_memory_reuse_below=None``): what the fresh pages cost the passes.

``--breakdown N`` sets each pass against its floor, the roofline's (``benchmarks/roofline.py``: the pass's
matrix products over its real tokens at this machine's measured rates at their shapes, attention counted as
products too). It times the passes N times as ``--timed`` does, then N times more with each product's and
each attention's own time and FLOPs taken around the operator call (a ``TorchDispatchMode``, no profiler:
recording shapes, the profiler made W3's short element-wise operators take 10x their time), and prints per
pass (the update: its forward and backward) its time and its floor; the products' and the attention's
time, FLOPs and rate; the rest (norms, rotary, SiLU, residuals, the head's log-softmax, copies, dispatch)
as the plain time less those two. What the pass would need to reach a share of its floor reads off the
lines. ``--workload W3`` (in every mode) runs W3's update instead: 8 prompts of 41-48 tokens (its
first timed step's) x 8 completions of 16 tokens, one micro-batch as its trainer runs it (``--breakdown``
leaves out the reference pass, which W3 does not run: beta 0).

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
    ap.add_argument("--breakdown", type=int, default=0, help="time each pass N times against its floor")
    ap.add_argument("--workload", choices=("W3", "W4"), default="W4", help="the micro-batch's shape")
    a = ap.parse_args()
    if a.timed:
        timed(a.model, a.bf16, a.timed, a.every_block_kept, a.workload)
        return
    if a.breakdown:
        breakdown(a.model, a.bf16, a.breakdown, a.workload)
        return
    from common import print_operator_time
    from torch.profiler import ProfilerActivity, profile

    passes = TrainerPasses(a.model, a.bf16, workload=a.workload)
    precision = "bf16 autocast" if a.bf16 else "fp32"
    threads = torch.get_num_threads()
    print(f"SmolLM2-135M-Instruct, {a.workload}'s micro-batch, {precision}, {threads} threads")
    print(f"{len(passes.lengths)} rows, {sum(passes.lengths)} real completion tokens")
    passes.warm_up()
    timed_as = {
        "forward + backward": (passes.update, ("  forward", "  backward")),
        "no-grad pass": (passes.reference, ("reference",)),
    }
    for name, (run, parts) in timed_as.items():
        run()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
        seconds = sum(passes.seconds[part][0] for part in parts)  # (the unprofiled run's)
        print(f"{name}: {seconds:.2f} s unprofiled; profiled:")
        print_operator_time(prof.key_averages(), KINDS, "element-wise and the rest", a.top)


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


W3_PROMPTS = (41, 41, 45, 45, 48, 41, 41, 45)
"""W3's prompt lengths in the first timed step of its runs (``bench_grpo.py``'s ``lengths``)."""
W3_LENGTHS = (16,) * 64
"""W3's completions: 8 x 8 rows of 16 tokens (EOS suppressed)."""


def workload_batch(workload: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(prompt lengths, completion lengths) of ``--workload``'s micro-batch (groups of
    ``saved_activations.G``)."""
    from saved_activations import LENGTHS, PROMPTS

    return (W3_PROMPTS, W3_LENGTHS) if workload == "W3" else (PROMPTS, LENGTHS)


class TrainerPasses:
    """The update (forward and backward) and the reference pass over one micro-batch of ``workload``'s
    shape (``workload_batch``), as the trainer runs them: under its CPU runtime
    (``grpokit.parallel.cpu_runtime`` at ``GRPOConfig``'s defaults, or ``cpu_memory_reuse_below=None`` with
    ``every_block_kept``: blocks from 1 MiB mapped fresh, the backward's from the heap, the update starting
    from a trimmed heap), the update inside ``recomputed_in_backward``, each pass's seconds appended to
    ``seconds``."""

    def __init__(
        self, model_dir: str, bf16: bool, every_block_kept: bool = False, workload: str = "W4"
    ) -> None:
        from saved_activations import w4_batch
        from smollm2 import prepare
        from transformers import AutoModelForCausalLM

        from grpokit.config import GRPOConfig
        from grpokit.parallel import cpu_runtime

        kept = {"cpu_memory_reuse_below": None} if every_block_kept else {}
        config = GRPOConfig(output_dir=tempfile.gettempdir(), **kept)  # (the config writes nothing there)
        cpu_runtime.apply_cpu_runtime(config, cpu=True)
        # (the runtime of the commit timed: one without the backward's heap runs its backward as it did)
        self.blocks_from_heap = getattr(cpu_runtime, "blocks_from_heap", contextlib.nullcontext)
        self.trim_heap = getattr(cpu_runtime, "trim_heap", lambda: None)
        self.model_dir = prepare(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        # the weights in memory of their own, as the trainer's are after its first optimizer step:
        # from_pretrained leaves them in a private mapping of the weights file, each page copied when first
        # written (the update over the mapping ran about 4% slower; the reference pass, whose weights stay
        # mapped in the trainer, did not)
        with torch.no_grad():
            for parameter in self.model.parameters():
                parameter.data = parameter.data.clone()
        as_the_trainer_loads_it(self.model)
        self.prompts, self.lengths = workload_batch(workload)
        self.batch = w4_batch(self.model.config.vocab_size, self.prompts, self.lengths)
        self.bf16 = bf16
        names = ("update", "  forward", "  backward", "reference")
        self.seconds: dict[str, list[float]] = {name: [] for name in names}

    def autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast("cpu", dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext()

    def update(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        """The update's forward and backward; returns its log-probs, entropies, the head's gradient norm."""
        from saved_activations import G

        from grpokit.models.recompute import recomputed_in_backward
        from grpokit.train.forward import completion_logprobs

        model = self.model
        start = time.perf_counter()
        self.trim_heap()
        begin = time.perf_counter()
        with self.autocast(), recomputed_in_backward():
            lp, ent = completion_logprobs(
                model, *self.batch, num_generations=G, padding_free=True, with_entropy=True
            )
        middle = time.perf_counter()
        with self.blocks_from_heap():
            (lp.sum() + ent.sum()).backward()  # (after autocast is left, as the trainer calls it)
        end = time.perf_counter()
        head_grad = float(model.get_output_embeddings().weight.grad.norm())
        model.zero_grad(set_to_none=True)
        self.seconds["update"].append(time.perf_counter() - start)  # (with the heap's trim before it)
        self.seconds["  forward"].append(middle - begin)
        self.seconds["  backward"].append(end - middle)
        return lp.detach(), ent.detach(), head_grad

    def reference(self) -> torch.Tensor:
        """The reference's no-grad pass; returns its log-probs."""
        from saved_activations import G

        from grpokit.train.forward import no_grad_logprobs

        begin = time.perf_counter()
        with self.autocast():
            out = no_grad_logprobs(
                self.model, *self.batch, num_generations=G, micro_batch_size=len(self.batch[0]),
                padding_free=True,
            )  # fmt: skip
        self.seconds["reference"].append(time.perf_counter() - begin)
        return out

    def warm_up(self) -> None:
        self.update(), self.reference()
        for times in self.seconds.values():
            times.clear()


def timed(
    model_dir: str, bf16: bool, repeats: int, every_block_kept: bool = False, workload: str = "W4"
) -> None:
    """``--timed``: the update's forward + backward and the reference pass, ``repeats`` times each in turn
    (``every_block_kept``: under ``cpu_memory_reuse_below=None``)."""
    import hashlib

    import grpokit

    passes = TrainerPasses(model_dir, bf16, every_block_kept, workload)
    precision = "bf16 autocast" if bf16 else "fp32"
    blocks = "every block kept" if every_block_kept else "default"
    print(f"grpokit from {os.path.dirname(grpokit.__file__)}, {precision}, blocks: {blocks}")
    passes.warm_up()
    for _ in range(repeats):
        lp, ent, head_grad = passes.update()
        ref = passes.reference()
    for name, times in passes.seconds.items():
        print(f"  {name}: " + " ".join(f"{t:.2f}" for t in times) + " s")
    digest = hashlib.sha1(lp.numpy().tobytes() + ref.numpy().tobytes()).hexdigest()[:12]
    print(f"  log-probs (update, reference) {digest}, entropy sum {float(ent.sum()):.6f}")
    print(f"  the LM head's gradient norm {head_grad:.6f}")


PRODUCTS = (
    "mkldnn::_linear_pointwise", "aten::linear", "aten::matmul", "aten::mm", "aten::addmm", "aten::addmm_",
    "aten::bmm",
)  # fmt: skip
"""The operators ``--breakdown`` times as products (float32 ones oneDNN's, ``grpokit.models.cpu_linear``;
MKL's and autocast's bf16 ones torch's own: without gradients ``linear`` itself reaches the dispatch mode,
with them the ``mm`` / ``addmm`` it runs)."""
ATTENTION = (
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
)
"""The CPU attention's operators ``--breakdown`` times: without gradients ``scaled_dot_product_attention``
itself reaches the dispatch mode, with them the flash kernel's forward and backward it runs."""


def product_flops(name: str, args: tuple) -> int:
    """2 m k n of one product operator's call (``PRODUCTS``)."""
    if name in ("mkldnn::_linear_pointwise", "aten::linear"):  # (x [*, k], w [n, k], b, ...)
        x, w = args[0], args[1]
        return 2 * x.numel() * w.shape[0]
    a, b = (args[1], args[2]) if name in ("aten::addmm", "aten::addmm_") else args[:2]
    return 2 * a.numel() * b.shape[-1]  # [(B,) m, k] x [(B,) k, n]


def attention_flops(func, args: tuple, kwargs: dict) -> int:
    """FLOPs of one attention operator's call, as the roofline counts them: 4 x d x heads per query and key
    it sees (the scores and the values' product), twice that for the backward. The keys a query sees: those
    its mask leaves finite (or True), else all of them, or under ``is_causal`` those up to its own place."""
    given = {**{a.name: v for a, v in zip(func._schema.arguments, args)}, **kwargs}
    q, k, mask, causal = given["query"], given["key"], given.get("attn_mask"), given.get("is_causal", False)
    n, heads, lq, d = q.shape
    lk = k.shape[2]
    if mask is not None:
        seen = mask if mask.dtype == torch.bool else torch.isfinite(mask)
        seen = seen.reshape(-1, lq, lk)  # [1, b or b x heads, lq, lk] -> [1 or b or b x heads, lq, lk]
        pairs = int(seen.sum()) * n // seen.shape[0]
    elif causal:
        pairs = n * sum(min(i + 1, lk) for i in range(lq))
    else:
        pairs = n * lq * lk
    return (8 if func._schema.name.endswith("_backward") else 4) * d * heads * pairs


class OperatorClock(torch.utils._python_dispatch.TorchDispatchMode):
    """Each product's and each attention's own seconds and FLOPs, summed by kind, timed around the operator
    call (``PRODUCTS``, ``ATTENTION``); every other operator runs untimed."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = {"products": 0.0, "attention": 0.0}
        self.flops = {"products": 0, "attention": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        kind = "products" if name in PRODUCTS else "attention" if name in ATTENTION else None
        if kind is None:
            return func(*args, **kwargs)
        begin = time.perf_counter()
        out = func(*args, **kwargs)
        self.seconds[kind] += time.perf_counter() - begin
        if kind == "products":
            self.flops[kind] += product_flops(name, args)
        else:
            self.flops[kind] += attention_flops(func, args, kwargs)
        return out


def breakdown(model_dir: str, bf16: bool, repeats: int, workload: str = "W4") -> None:
    """``--breakdown``: each pass against its floor, and where its time beyond the floor goes."""
    import statistics

    from common import WORKLOADS
    from roofline import Rates, model_shape, real_phase_products, roofline

    passes = TrainerPasses(model_dir, bf16, workload=workload)
    names = ("update", "reference") if WORKLOADS[workload].beta > 0 else ("update",)
    precision = "bf16" if bf16 else "fp32"
    print(f"SmolLM2-135M-Instruct, {workload}'s micro-batch, {precision}, {torch.get_num_threads()} threads:")
    print(f"{len(passes.lengths)} rows, prompts {passes.prompts}, {sum(passes.lengths)} completion tokens")
    runs = {"update": passes.update, "reference": passes.reference}
    passes.warm_up()
    for _ in range(repeats):
        for name in names:
            runs[name]()
    plain = {"reference": statistics.median(passes.seconds["reference"] or [0.0])}
    # the update's forward and backward (what its floor counts; without the heap's trim before them)
    plain["update"] = statistics.median(
        map(sum, zip(passes.seconds["  forward"], passes.seconds["  backward"]))
    )
    clocks = {name: [] for name in names}
    for _ in range(repeats):
        for name in names:
            with OperatorClock() as clock:
                runs[name]()
            clocks[name].append(clock)
    shape = model_shape(passes.model_dir)
    phases = real_phase_products(shape, WORKLOADS[workload], list(passes.prompts), list(passes.lengths))
    rates = Rates()
    products = {"update": phases["policy_forward"] + phases["backward"], "reference": phases.get("ref_logps")}
    for name in names:
        gflop, floor = roofline(products[name], rates, precision)
        spent = plain[name]
        print(
            f"\n{name}: {spent:.2f} s (median of {repeats}), floor {floor:.2f} s ({floor / spent:.0%}): "
            f"{gflop:.1f} GFLOP at {gflop / floor:.0f} GFLOP/s; at 60% of it: {floor / 0.6:.2f} s"
        )
        # beyond the floor: a kind's time less its FLOPs at the floor's mean rate (the floor counts the same
        # products and attention, so the three lines sum to the pass's time less its floor)
        print(f"  {'':10s} {'s':>6s} {'share':>6s} {'GFLOP':>7s} {'GFLOP/s':>8s} {'beyond the floor':>17s}")
        rest = spent
        for kind in ("products", "attention"):
            seconds = statistics.median(c.seconds[kind] for c in clocks[name])
            kind_gflop = clocks[name][0].flops[kind] / 1e9
            rest -= seconds
            rate = f"{kind_gflop / seconds:8.0f}" if seconds > 0 else f"{'-':>8s}"
            beyond = seconds - kind_gflop / (gflop / floor)
            share = seconds / spent
            print(f"  {kind:10s} {seconds:6.2f} {share:6.0%} {kind_gflop:7.1f} {rate} {beyond:15.2f} s")
        print(f"  {'the rest':10s} {rest:6.2f} {rest / spent:6.0%} {'':7s} {'':8s} {rest:15.2f} s")


if __name__ == "__main__":
    main()
