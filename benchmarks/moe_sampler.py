"""The fast sampler on mixture-of-experts decoders beside ``model.generate``, and what recording the routing
costs.

For each architecture (tiny Qwen3-MoE and Mixtral: hidden 256, 4 layers, 8 experts of width 256, 2 per
token; randomly initialised, so completions rarely stop early): 16 prompts x G = 8 completions of up to 64
tokens, sampled at temperature 1 by

- ``generate``: ``model.generate`` on the prompts repeated G times (grpokit's ``transformers`` backend),
- ``fast``: grpokit's fast sampler (each prompt prefilled once, native decode, the experts as the model's own
  grouped-matmul module),
- ``fast+routing``: the same with the routers' choices recorded (``install_routing``: what every MoE run
  does, for ``routing/*`` and R3);
- ``fast, LoRA attention`` / ``fast, LoRA all-linear``: the fast sampler over a PEFT LoRA policy (rank 16,
  nonzero adapters) on q/k/v/o, or on ``all-linear``, which peft 0.22 extends to the experts' stacked
  parameters and the router: peft computes their merged W + BA in every forward of the layer, so at every
  decode step.

Each is timed over ``--repeats`` calls after one warm-up call, one torch thread, alone on the machine; the
result is completion tokens per second and the ratio to ``generate``, written as JSON.

Usage (about two minutes):

    python benchmarks/moe_sampler.py --out benchmarks/results/moe-sampler.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model

from grpokit.models.routing_replay import install_routing
from grpokit.models.tiny import build_char_tokenizer, build_tiny_moe
from grpokit.rollout.base import SamplingParams
from grpokit.rollout.fast import FastSampler
from grpokit.rollout.hf import TransformersBackend

SIZE = {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2, "expert_size": 256}
LORA = {
    "fast, LoRA attention": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "fast, LoRA all-linear": "all-linear",
}


def tokens_per_second(backend, prompts, group: int, params: SamplingParams, repeats: int) -> float:
    backend.generate(prompts, group, params)  # warm-up
    start, tokens = time.perf_counter(), 0
    for _ in range(repeats):
        out = backend.generate(prompts, group, params)
        tokens += sum(len(c) for c in out.completion_ids)
    return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/moe-sampler.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = build_char_tokenizer()
    prompts = [tokenizer.encode(f"{a}+{b}*{a}{b}=") for a, b in zip(range(10, 26), range(40, 56))]
    params = SamplingParams.for_tokenizer(tokenizer, max_new_tokens=64)
    results = {}
    for arch in ("qwen3_moe", "mixtral"):
        model = build_tiny_moe(tokenizer, arch, **SIZE).eval()
        rates = {
            "generate": tokens_per_second(TransformersBackend(model), prompts, 8, params, args.repeats),
            "fast": tokens_per_second(FastSampler(model), prompts, 8, params, args.repeats),
        }
        install_routing(model)
        rates["fast+routing"] = tokens_per_second(FastSampler(model), prompts, 8, params, args.repeats)
        for name, targets in LORA.items():
            config = LoraConfig(r=16, lora_alpha=32, target_modules=targets, init_lora_weights=False)
            lora = get_peft_model(build_tiny_moe(tokenizer, arch, **SIZE), config).eval()
            rates[name] = tokens_per_second(FastSampler(lora), prompts, 8, params, args.repeats)
        results[arch] = {
            "tokens_per_s": {k: round(v, 1) for k, v in rates.items()},
            "fast_over_generate": round(rates["fast"] / rates["generate"], 2),
            "routing_cost": round(1 - rates["fast+routing"] / rates["fast"], 3),
            "lora_all_linear_over_attention": round(
                rates["fast, LoRA all-linear"] / rates["fast, LoRA attention"], 2
            ),
            "parameters": sum(p.numel() for p in model.parameters()),
        }
        print(arch, json.dumps(results[arch]))
    record = {"date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or platform.machine(),
              "torch": torch.__version__, "threads": 1, "prompts": 16, "group": 8, "max_new_tokens": 64,
              "size": SIZE, "results": results}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
