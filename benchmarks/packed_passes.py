"""Packed against padded training passes, side by side, on SmolLM2-135M-Instruct.

Times ``completion_logprobs`` forward and backward (the update's pass, with entropy) and ``no_grad_logprobs``
(the reference pass) on two batches of 2 groups of 8 with the shared prefix, once padded and once packed
(``padding_free``):

- W4-shaped: prompts of 165 and 90 tokens, completions of 2-256 (``saved_activations.LENGTHS``; real
  completion tokens 34% of the padded ones);
- W3-shaped: prompts of 48 and 41 tokens, every completion 16 tokens (5% padding: what packing costs when
  there is little to remove).

    python benchmarks/packed_passes.py [--model DIR] [--bf16] [--repeats 3]

prints, per batch and pass, the median seconds of each and their ratio. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

BATCHES = {
    "W4-shaped": ((165, 90), None),  # None: saved_activations.LENGTHS
    "W3-shaped": ((48, 41), (16,) * 16),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(tempfile.gettempdir(), "grpokit-bench", "smollm2"))
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast over the float32 weights")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each pass, after one untimed")
    a = ap.parse_args()
    from saved_activations import LENGTHS, G, w4_batch
    from smollm2 import prepare
    from transformers import AutoModelForCausalLM

    from grpokit.train.forward import completion_logprobs, no_grad_logprobs

    model = AutoModelForCausalLM.from_pretrained(prepare(a.model), dtype=torch.float32)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if a.bf16 else contextlib.nullcontext()
    print(
        f"SmolLM2-135M-Instruct, {'bf16 autocast' if a.bf16 else 'fp32'}, {torch.get_num_threads()} threads"
    )
    for name, (prompts, lengths) in BATCHES.items():
        batch = w4_batch(model.config.vocab_size, prompts, lengths or LENGTHS)
        rows = len(batch[0])
        real = int(batch[3].sum())
        print(f"{name}: {rows} rows, {real} real completion tokens of {batch[3].numel()}")

        def update(packed: bool, batch=batch) -> None:
            with autocast:
                lp, ent = completion_logprobs(
                    model, *batch, num_generations=G, padding_free=packed, with_entropy=True
                )
            (lp.sum() + ent.sum()).backward()
            model.zero_grad(set_to_none=True)

        def reference(packed: bool, batch=batch, rows=rows) -> None:
            with autocast:
                no_grad_logprobs(model, *batch, num_generations=G, micro_batch_size=rows, padding_free=packed)

        for label, run in (("forward + backward", update), ("no-grad pass", reference)):
            seconds = {}
            for packed in (False, True):
                run(packed)  # untimed
                times = []
                for _ in range(a.repeats):
                    begin = time.perf_counter()
                    run(packed)
                    times.append(time.perf_counter() - begin)
                seconds[packed] = statistics.median(times)
            print(
                f"  {label:18s} padded {seconds[False]:6.2f} s   packed {seconds[True]:6.2f} s   "
                f"packed / padded {seconds[True] / seconds[False]:.2f}"
            )


if __name__ == "__main__":
    main()
