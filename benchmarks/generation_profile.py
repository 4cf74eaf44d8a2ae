"""Where W4's generation time goes: one W4-shaped sampling call (SmolLM2-135M-Instruct, 4 of W4's varied chat
prompts x G = 8, EOS on, up to 256 new tokens, temperature 1) through the fast sampler, timed on its own and
then under ``torch.profiler``, its operators' own CPU time summed by kind:

- projections and LM head: ``aten::mm`` / ``addmm`` / ``mkldnn::_linear_pointwise`` (the decode's fused
  and plain linear layers, on packed weights where ``packs_weights`` says so, and the prefill's);
- attention: ``bmm``, ``scaled_dot_product_*`` and softmax (the decode's split attention, the prefill's SDPA);
- casts: ``copy_`` / ``_to_copy`` (under autocast: the activations cast to bf16 before each product);
- the rest: element-wise work (norms, rotary, SiLU, residuals), indexing and the KV buffers' bookkeeping, and
  sampling (the processed scores' softmax, cumulative sums, the inverse CDF).

    python benchmarks/generation_profile.py [--model DIR] [--bf16] [--seed 0] [--top N] [--unpacked]
                                            [--alternate N [--against unpacked|few-rows]]

``--unpacked`` runs the decode's products on the weights as they are, as where ``packs_weights`` says no.

``--alternate N`` profiles nothing: it times the call N times packed and N times unpacked, in turn, in one
process (after one warm-up call), so that both see the same machine. With ``--against few-rows`` the other
call is packed too but runs its last 1-2 float32 rows by columns on the plain weights (as
``packed_fp32_min_rows`` has it off Zen 5), the one call with them packed (as on Zen 5).

``--top N`` also lists the N operators with the most own CPU time, with their calls.

Run it alone on the machine. The profiler adds its own overhead: compare the kinds' shares, not their sums
with the unprofiled time.
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
    "projections and LM head": ("aten::mm", "aten::addmm", "mkldnn::_linear_pointwise"),
    "attention": ("aten::bmm", "aten::_softmax", "aten::_scaled_dot_product_flash_attention_for_cpu"),
    "casts": ("aten::copy_", "aten::_to_copy"),
}
"""Operator names summed into each kind (self CPU time); every other operator is "the rest"."""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(tempfile.gettempdir(), "grpokit-bench", "smollm2"))
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast over the float32 weights")
    ap.add_argument("--unpacked", action="store_true", help="products on the weights as they are")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top", type=int, default=0, help="also list the operators with the most own time")
    ap.add_argument("--alternate", type=int, default=0, help="time N calls packed and N unpacked, in turn")
    ap.add_argument("--against", choices=("unpacked", "few-rows"), default="unpacked",
                    help="--alternate's other call: unpacked, or 1-2 float32 rows by columns")  # fmt: skip
    a = ap.parse_args()
    from grpokit.rollout import native_decode

    packs_weights, min_rows = native_decode.packs_weights, native_decode.packed_fp32_min_rows
    if a.unpacked:
        native_decode.packs_weights = lambda device, dtype: False
    from common import WORKLOADS, benchmark_rows, print_operator_time
    from smollm2 import prepare
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpokit.rollout.base import SamplingParams
    from grpokit.rollout.fast import FastSampler

    folder = prepare(a.model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    wl = WORKLOADS["W4"]
    rows = benchmark_rows(wl, wl.num_prompts, seed=a.seed)
    prompts = [list(tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True,
                                                  return_dict=True)["input_ids"]) for r in rows]  # fmt: skip
    params = SamplingParams.for_tokenizer(
        tokenizer, max_new_tokens=wl.max_new_tokens, temperature=wl.temperature
    )
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if a.bf16 else contextlib.nullcontext()

    def sample() -> tuple[float, FastSampler, list[list[int]]]:
        sampler = FastSampler(model, generator=torch.Generator().manual_seed(a.seed))
        begin = time.perf_counter()
        with autocast:
            out = sampler.generate(prompts, wl.num_generations, params)
        return time.perf_counter() - begin, sampler, out.completion_ids

    sample()  # warm-up
    precision = "bf16 autocast" if a.bf16 else "fp32"
    unpacked = lambda device, dtype: False  # noqa: E731
    ways = {"packed": (packs_weights, min_rows), "unpacked": (unpacked, min_rows)}
    if a.against == "few-rows":
        ways = {"1-2 rows packed": (packs_weights, lambda: 1), "by columns": (packs_weights, lambda: 3)}
    for _ in range(a.alternate):
        for way, (packs, fewest) in ways.items():
            native_decode.packs_weights, native_decode.packed_fp32_min_rows = packs, fewest
            seconds, sampler, completions = sample()
            stats, tokens = sampler.last_stats, sum(len(c) for c in completions)
            print(f"{precision}, {way:8s}: {seconds:6.2f} s, {tokens} completion tokens, "
                  f"{stats['decode_steps']} decode steps, {stats['decoded_rows']} rows decoded",
                  flush=True)  # fmt: skip
    if a.alternate:
        return
    seconds, sampler, completions = sample()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        sample()
    events = prof.key_averages()
    lengths = sorted(len(c) for c in completions)
    print(f"SmolLM2-135M-Instruct, {precision}, {torch.get_num_threads()} threads")
    print(f"prompts of {[len(p) for p in prompts]} tokens x {wl.num_generations}")
    print(f"completion lengths {lengths}")
    print(f"{sum(lengths)} completion tokens, {sampler.last_stats['decode_steps']} decode steps")
    print(f"sampling call: {seconds:.2f} s unprofiled; profiled:")
    print_operator_time(events, KINDS, "the rest", a.top)


if __name__ == "__main__":
    main()
