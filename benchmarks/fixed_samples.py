"""Record a workload's completions once, for every side to replay (``--fixed-samples``, common.FixedSamples).

Sampled from the initial model with grpokit's default generation backend (the fast sampler), the workload's
temperature and completion limit, EOS as the workload has it (suppressed when ``eos`` is False, as on both
sides), for the first ``(warmup + steps) x num_prompts`` rows of the dataset: the rows the sides read in
order when they replay.

Usage: python fixed_samples.py --model DIR --workload W4 --steps 2 --warmup 1 --seed 0 --out samples.json
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (
    NUM_DATASET_PROMPTS,
    WORKLOADS,
    benchmark_rows,
    length_summary,
    prompt_token_ids,
    run_arguments,
)


def main() -> None:
    a = run_arguments(__doc__).parse_args()

    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from grpokit.rollout import SamplingParams, make_backend

    wl = WORKLOADS[a.workload]
    num_rows = (a.warmup + a.steps) * wl.num_prompts
    if num_rows > NUM_DATASET_PROMPTS:
        raise SystemExit(f"{num_rows} rows needed, the dataset has {NUM_DATASET_PROMPTS}: fewer steps")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(a.model)
    rows = benchmark_rows(wl, NUM_DATASET_PROMPTS, a.seed)[:num_rows]
    prompt_ids = [prompt_token_ids(tokenizer, row["prompt"]) for row in rows]
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    sampling = {"max_new_tokens": wl.max_new_tokens, "temperature": wl.temperature}
    params = SamplingParams.for_tokenizer(tokenizer, **sampling)
    if not wl.eos and params.eos_token_ids:  # every completion runs to max_new_tokens (EOS never drawn)
        params = replace(params, eos_token_ids=(), suppress_token_ids=params.eos_token_ids)
    torch.manual_seed(a.seed)
    completions = []
    with torch.no_grad():
        for first in range(0, num_rows, wl.num_prompts):  # one step's prompts per call, as a side samples
            out = make_backend("auto", model).generate(
                prompt_ids[first : first + wl.num_prompts], wl.num_generations, params
            )
            completions += out.completion_ids
    G = wl.num_generations
    recorded = {
        "workload": wl.name,
        "seed": a.seed,
        "num_generations": G,
        "rows": [
            {"prompt_ids": ids, "completion_ids": completions[k * G : (k + 1) * G]}
            for k, ids in enumerate(prompt_ids)
        ],
    }
    with open(a.out, "w") as f:
        json.dump(recorded, f)
    for step in range(a.warmup + a.steps):
        lengths = [len(c) for c in completions[step * wl.batch : (step + 1) * wl.batch]]
        print(f"step {step}: completion lengths {length_summary(lengths)}")


if __name__ == "__main__":
    main()
