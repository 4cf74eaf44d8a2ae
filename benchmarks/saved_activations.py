"""What one W4-shaped update micro-batch keeps for its backward, counted tensor by tensor.

Runs ``completion_logprobs`` (the update's forward: packed, shared prefix, with entropy) of
SmolLM2-135M-Instruct over 2 groups of 8 completions with W4's spread of lengths (prompts of 165 and 90
tokens, completions of 2-256), and records every tensor autograd saves for the backward
(``torch.autograd.graph.saved_tensors_hooks``), each storage once. Parameters (the weights a matmul saves)
are left out: they exist anyway. The model's MLPs and norms are the lean ones the trainer installs
(``lean_activations``), and the forward runs inside the update's ``recomputed_in_backward`` block, which
keeps the norms' and the packed attention's outputs as recipes (counted apart); or ``transformers``' own
layers outside the block with ``--transformers-layers``, or the lean ones outside it with ``--kept``.

    python benchmarks/saved_activations.py [--model DIR] [--transformers-layers | --kept] [--bf16]

``--bf16``: the forward under bf16 autocast, as the update runs it with ``bf16=True``.

prints the saved bytes by shape, the total, and the part the packed attention saves
(``grpokit.models.packing``: the queries, keys, values and outputs it hands to
``scaled_dot_product_attention``, and the masks) next to what queries, outputs, keys and values take over
the real tokens only.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

GROUPS, G = 2, 8
PROMPTS = (165, 90)
LENGTHS = (2, 44, 151, 256, 8, 46, 256, 30, 12, 60, 100, 20, 256, 5, 40, 90)


def w4_batch(
    vocab: int, prompts: tuple[int, ...] = PROMPTS, lengths: tuple[int, ...] = LENGTHS, group: int = G
) -> tuple[torch.Tensor, ...]:
    """prompt ids/mask [B, P] (left-padded, one prompt of ``prompts`` per group of ``group`` rows), completion
    ids/mask [B, C] (right-padded to the longest of ``lengths``); random ids, fixed seed."""
    generator = torch.Generator().manual_seed(0)
    rows, width, longest = len(lengths), max(prompts), max(lengths)
    prompt_mask = torch.zeros(rows, width, dtype=torch.long)
    prompt_ids = torch.zeros(rows, width, dtype=torch.long)
    for g, length in enumerate(prompts):
        ids = torch.randint(10, vocab, (length,), generator=generator)
        prompt_mask[g * group : (g + 1) * group, width - length :] = 1
        prompt_ids[g * group : (g + 1) * group, width - length :] = ids
    completion_mask = (torch.arange(longest)[None] < torch.tensor(lengths)[:, None]).long()
    completion_ids = torch.randint(10, vocab, (rows, longest), generator=generator)
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(tempfile.gettempdir(), "grpokit-bench", "smollm2"))
    ap.add_argument("--transformers-layers", action="store_true", help="without the lean MLPs and norms")
    ap.add_argument("--kept", action="store_true", help="lean layers, outside the update's recompute block")
    ap.add_argument("--bf16", action="store_true", help="under bf16 autocast, as the update with bf16=True")
    a = ap.parse_args()
    from smollm2 import prepare
    from transformers import AutoModelForCausalLM

    from grpokit.models import packing, recompute
    from grpokit.models.cpu_linear import use_onednn_linears
    from grpokit.models.lean_layers import use_lean_layers
    from grpokit.train.forward import completion_logprobs

    model = AutoModelForCausalLM.from_pretrained(prepare(a.model), dtype=torch.float32)
    use_onednn_linears(model)  # the policy's linears as the trainer gives them (grpokit.models.policy)
    if not a.transformers_layers:
        use_lean_layers(model)
    config = model.config
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}
    by_shape: collections.Counter = collections.Counter()
    attention = {"inside": False, "bytes": 0}
    recipes: dict[int, int] = {}  # made again in the backward: recipe -> the bytes of what it stands for

    def observe(tensor: torch.Tensor, saved) -> None:  # inside the block: what it keeps for each tensor
        if saved is tensor:
            pack(tensor)
        else:
            recipes[id(saved.recipe)] = tensor.untyped_storage().nbytes()

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in seen and storage.data_ptr() not in parameters:
            seen[storage.data_ptr()] = storage.nbytes()
            by_shape[(tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))] += storage.nbytes()
            attention["bytes"] += storage.nbytes() if attention["inside"] else 0
        return tensor

    def counted(kernel):
        def run(*args):
            attention["inside"] = True
            try:
                return kernel(*args)
            finally:
                attention["inside"] = False

        return run

    for name in ("_per_run", "_padded_batch"):  # the kernels packed_attention runs off flash-attn
        setattr(packing, name, counted(getattr(packing, name)))

    batch = w4_batch(config.vocab_size)
    block = not (a.transformers_layers or a.kept)
    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16)
    with recompute.recomputed_in_backward(observe) if block else hooks, autocast:
        completion_logprobs(model, *batch, num_generations=G, padding_free=True, with_entropy=True)

    mib = 2**20
    rows, completions = GROUPS * G, sum(LENGTHS)
    real = sum(PROMPTS) + completions
    print(f"{rows} rows, {real} real tokens ({sum(PROMPTS)} prompt, {completions} completion)")
    print(f"saved for the backward, parameters excluded: {sum(seen.values()) / mib:.0f} MiB")
    if block:
        print(f"made again in the backward instead (norms' and joined attention outputs): "
              f"{sum(recipes.values()) / mib:.0f} MiB in {len(recipes)} tensors")  # fmt: skip
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = config.hidden_size // heads
    keys = sum(PROMPTS[g] * G + sum(LENGTHS[g * G : (g + 1) * G]) for g in range(GROUPS))  # each row's keys
    unpadded = 4 * config.num_hidden_layers * head_dim * (2 * heads * completions + 2 * kv * keys)
    print(
        f"saved by the packed attention: {attention['bytes'] / mib:.0f} MiB; queries, outputs, keys and "
        f"values over the real tokens only (each row's prompt keys included): {unpadded / mib:.0f} MiB"
    )
    for (shape, dtype), size in by_shape.most_common(16):
        print(f"{size / mib:9.1f} MiB  {shape} {dtype}")


if __name__ == "__main__":
    main()
