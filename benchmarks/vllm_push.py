"""The cost of pushing a policy's weights into a colocated vLLM engine, on whatever vLLM runs here (its CPU
build on this project's machines): a SmolLM2-135M-shaped Llama built locally (random weights, no hub), the
engine built as ``GRPOTrainer(use_vllm=True)`` builds it, then ``sync_weights()`` timed, and greedy
completions checked against ``transformers`` after a perturbation of every weight (they must follow it).

    python benchmarks/vllm_push.py [--dtype float32|bfloat16] [--pushes 5]

Prints one line per push and a summary; docs/generation.md quotes the numbers. Needs vllm (not part of the
main test environment: .ci/run's second stage has it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from grpokit import GRPOConfig
from grpokit.rollout import SamplingParams
from grpokit.rollout.vllm_backend import make_vllm_backend

SMOLLM2_135M = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, max_position_embeddings=2048, tie_word_embeddings=True, rms_norm_eps=1e-5,
    rope_theta=100000.0, bos_token_id=0, eos_token_id=0,
)  # fmt: skip
"""SmolLM2-135M's config.json values (its architecture, not its weights)."""


@torch.no_grad()
def greedy(model: torch.nn.Module, prompt: list[int], max_new: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False, eos_token_id=0,
        pad_token_id=0, top_p=None, top_k=None, temperature=None,
    )  # fmt: skip
    return out[0, len(prompt) :].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--pushes", type=int, default=5)
    options = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**SMOLLM2_135M), dtype=torch.float32).eval()
    size = sum(p.numel() for p in model.parameters())
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, use_vllm=True, generation_dtype=options.dtype, max_prompt_length=32,
            max_completion_length=16,
        )  # fmt: skip
        started = time.perf_counter()
        backend = make_vllm_backend(args.vllm_settings(), model)
        print(f"engine built in {time.perf_counter() - started:.1f} s ({options.dtype})", flush=True)
        seconds = []
        for push in range(options.pushes):
            backend.sync_weights()
            seconds.append(backend.last_push_seconds)
            print(f"push {push + 1}: {seconds[-1]:.3f} s", flush=True)
        prompts = [[1, 2, 3, 4, 5, 6, 7, 8], [100, 200, 300, 400]]
        params = SamplingParams(max_new_tokens=16, do_sample=False, eos_token_ids=(0,))
        agree = []
        for _ in range(2):  # a perturbation of every weight, then the originals back (its negation)
            with torch.no_grad():
                for param in model.parameters():
                    param.mul_(-1.0)
            backend.sync_weights()
            engine = backend.generate(prompts, 1, params).completion_ids
            agree.append(engine == [greedy(model, p, 16) for p in prompts])
        backend.close()
    print(
        f"{size / 1e6:.1f} M parameters ({size * 4 / 2**20:.0f} MiB in fp32): push median "
        f"{statistics.median(seconds):.3f} s over {len(seconds)}; greedy equal to fp32 transformers after "
        f"each change: {agree}" + (" (a bf16 engine need not be)" if options.dtype != "float32" else "")
    )


if __name__ == "__main__":
    main()
