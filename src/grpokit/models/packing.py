"""Padding-free backbone calls: the rows of a batch packed into one sequence of their real tokens, attention
kept within each row by a variable-length attention.

A padded batch runs every layer's projections and MLP over ``B x (P + C)`` tokens, most of them padding when
completion lengths spread. Packed, the same layers run over the real tokens only (``[1, T]``, positions
restarting per row), and only attention needs to know where one row ends: a ``PackedLayout`` says, for each
row (a *sequence* of the packed call), which packed queries are its and which packed keys each may see.

Two layouts cover the training passes (``grpokit.train.forward``):

- ``PackedLayout.causal(lengths)``: each sequence attends causally to itself (a row's prompt and completion);
- ``PackedLayout.on_prefix(prefix_lengths, owners, lengths)``: sequences that continue a prefix packed in an
  earlier call (a group's prompt, its keys/values read from a cache): each sees all of its owner's prefix,
  then itself causally. The G completions of a group share one prefix, never copied G times.

The attention itself (``packed_attention``, the function a model's layers call once
``use_packed_attention`` has installed it) gathers each sequence's queries and keys into a per-sequence
batch and runs ``scaled_dot_product_attention`` with the sequence's mask, on any device; on CUDA with the
``flash-attn`` package and a half-precision model it calls ``flash_attn_varlen_func`` on the packed
tensors instead (its causal mask is aligned to the end of the keys, which is what ``on_prefix`` needs).
Calls without a layout go to the model's own attention unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = [
    "PACKED_MODEL_TYPES",
    "PackedLayout",
    "packed_attention",
    "packing_obstacles",
    "packing_supported",
    "refuse_unrunnable",
    "use_packed_attention",
]

PACKED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
"""Decoders whose packed call is exact: every layer full causal attention through ``transformers``'
attention interface, rotary positions from ``position_ids``, no other cross-token operation."""

LAYOUT_ARGUMENT = "grpokit_packing"
"""The keyword a packed backbone call passes its ``PackedLayout`` under; ``transformers`` hands every extra
keyword of a decoder's forward down to its layers' attention function."""

_PREFIX = "grpokit_packed_"


@dataclass(frozen=True)
class PackedLayout:
    """Where each of S sequences' queries and keys lie in a packed call of T queries and K keys.

    ``query_index`` [S, Lq] and ``key_index`` [S, Lk]: the packed positions of each sequence's queries and
    keys, in order (padding slots point at position 0); ``allowed`` [S, 1, Lq, Lk] bool: query j of sequence s
    may attend its key i (a padding query attends its first key only, so that no row of the softmax is empty);
    ``sequence_of`` / ``slot_of`` [T]: each packed query's sequence and place in it. For ``flash-attn``:
    ``flat_keys`` [sum Lk_s] the packed keys of every sequence one after the other, ``cu_queries`` /
    ``cu_keys`` [S+1] int32 their offsets, ``max_queries`` / ``max_keys``.
    """

    query_index: torch.Tensor
    key_index: torch.Tensor
    allowed: torch.Tensor
    sequence_of: torch.Tensor
    slot_of: torch.Tensor
    flat_keys: torch.Tensor
    cu_queries: torch.Tensor
    cu_keys: torch.Tensor
    max_queries: int
    max_keys: int

    @classmethod
    def causal(cls, lengths: torch.Tensor) -> PackedLayout:
        """Sequences of ``lengths`` [S] laid one after another; each attends causally to itself."""
        empty = torch.zeros_like(lengths)
        return cls.on_prefix(empty, torch.arange(len(lengths), device=lengths.device), lengths)

    @classmethod
    def on_prefix(
        cls, prefix_lengths: torch.Tensor, owners: torch.Tensor, lengths: torch.Tensor
    ) -> PackedLayout:
        """Sequences of ``lengths`` [S] laid one after another, sequence s continuing prefix ``owners[s]`` of
        the ``prefix_lengths`` [S_p] prefixes packed before them (keys: the prefixes' K_p, then the
        sequences'). Sequence s sees all of its prefix, then itself causally."""
        device = lengths.device
        lengths, prefix_lengths = lengths.long(), prefix_lengths.long()
        own_prefix = prefix_lengths[owners]  # [S]
        starts = lengths.cumsum(0) - lengths  # [S] first packed query of each sequence
        prefix_starts = prefix_lengths.cumsum(0) - prefix_lengths  # [S_p]
        total_prefix = int(prefix_lengths.sum())
        key_lengths = own_prefix + lengths  # [S]
        max_queries = int(lengths.max()) if len(lengths) else 0
        max_keys = int(key_lengths.max()) if len(lengths) else 0
        q_slots = torch.arange(max(max_queries, 1), device=device)  # [Lq]
        k_slots = torch.arange(max(max_keys, 1), device=device)  # [Lk]
        real_query = q_slots[None, :] < lengths[:, None]  # [S, Lq]
        query_index = torch.where(real_query, starts[:, None] + q_slots[None, :], 0)  # [S, Lq]
        in_prefix = k_slots[None, :] < own_prefix[:, None]  # [S, Lk]
        own = k_slots[None, :] - own_prefix[:, None]  # [S, Lk] place among the sequence's own keys
        key_index = torch.where(
            in_prefix,
            prefix_starts[owners][:, None] + k_slots[None, :],
            total_prefix + starts[:, None] + own,
        )  # [S, Lk]
        real_key = k_slots[None, :] < key_lengths[:, None]  # [S, Lk]
        key_index = torch.where(real_key, key_index, 0)
        # query j (at own place j) sees the prefix and own keys 0..j
        visible = in_prefix[:, None, :] | (own[:, None, :] <= q_slots[None, :, None])  # [S, Lq, Lk]
        allowed = visible & real_key[:, None, :] & real_query[:, :, None]
        allowed[:, :, 0] |= ~real_query  # a padding query attends one key: no empty softmax row
        sequence_of = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)  # [T]
        slot_of = torch.arange(int(lengths.sum()), device=device) - starts[sequence_of]  # [T]
        flat_keys = key_index[real_key]  # [sum Lk_s], row-major: sequence by sequence
        zero = torch.zeros(1, dtype=torch.int32, device=device)
        return cls(
            query_index=query_index,
            key_index=key_index,
            allowed=allowed[:, None],
            sequence_of=sequence_of,
            slot_of=slot_of,
            flat_keys=flat_keys,
            cu_queries=torch.cat([zero, lengths.cumsum(0).to(torch.int32)]),
            cu_keys=torch.cat([zero, key_lengths.cumsum(0).to(torch.int32)]),
            max_queries=max_queries,
            max_keys=max_keys,
        )


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Attention of a packed call: query [1, h, T, d], key/value [1, kv, K, d] -> ([1, T, h, d], None), each
    sequence of ``kwargs[LAYOUT_ARGUMENT]`` attending only to the keys its layout allows."""
    layout: PackedLayout = kwargs[LAYOUT_ARGUMENT]  # type: ignore[assignment]
    if _flash_varlen_usable(query):
        return _flash_varlen(query, key, value, layout, dropout, scaling), None
    q = query[0][:, layout.query_index].transpose(0, 1)  # [S, h, Lq, d]
    k = key[0][:, layout.key_index].transpose(0, 1)  # [S, kv, Lk, d]
    v = value[0][:, layout.key_index].transpose(0, 1)  # [S, kv, Lk, d]
    grouped = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=layout.allowed, dropout_p=dropout, scale=scaling, **grouped
    )  # [S, h, Lq, d]
    return out[layout.sequence_of, :, layout.slot_of][None], None  # [1, T, h, d]


def _flash_varlen_usable(query: torch.Tensor) -> bool:
    return query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and _flash_varlen() is not None


@functools.cache
def _flash_varlen():
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def _flash_varlen(query, key, value, layout: PackedLayout, dropout: float, scaling) -> torch.Tensor:
    """``flash_attn_varlen_func`` over the packed queries and each sequence's keys laid one after another (a
    prefix gathered once per sequence that reads it); causal, aligned to the end of each sequence's keys."""
    q = query[0].transpose(0, 1)  # [T, h, d]
    k = key[0][:, layout.flat_keys].transpose(0, 1)  # [sum Lk, kv, d]
    v = value[0][:, layout.flat_keys].transpose(0, 1)
    out = _flash_varlen()(
        q, k, v, layout.cu_queries, layout.cu_keys, layout.max_queries, layout.max_keys,
        dropout_p=dropout, softmax_scale=scaling, causal=True,
    )  # fmt: skip  # [T, h, d]
    return out[None]  # [1, T, h, d]


def packing_supported(config: object) -> bool:
    """Whether a model with this config runs packed exactly (``PACKED_MODEL_TYPES``, no sliding window)."""
    if getattr(config, "model_type", None) not in PACKED_MODEL_TYPES:
        return False
    if getattr(config, "use_sliding_window", False):
        return False
    if config.model_type == "mistral" and getattr(config, "sliding_window", None) is not None:
        return False
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    return all(kind == "full_attention" for kind in layer_types)


def packing_obstacles(config: object, padded_inputs: Sequence[str] = ()) -> list[str]:
    """Why passes of a model with this ``config`` (a vision-language model's text config is the one checked)
    cannot run packed: its type, and ``padded_inputs``, the names of the pass's inputs laid out by padded
    rows (images, routing replay, router logits). Empty when they can."""
    config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    reasons = []
    if not packing_supported(config):
        kind = getattr(config, "model_type", None)
        reasons.append(f"model type {kind!r} is not one of {', '.join(PACKED_MODEL_TYPES)} (full attention)")
    if padded_inputs:
        reasons.append(f"{', '.join(padded_inputs)}: laid out by padded rows")
    return reasons


def refuse_unrunnable(config: object, *, images: bool, routing_replay: bool) -> None:
    """``GRPOConfig.padding_free=True`` for a run whose passes cannot be packed: a ValueError saying why."""
    padded = [name for name, on in (("image prompts", images), ("routing replay", routing_replay)) if on]
    reasons = packing_obstacles(config, padded)
    if reasons:
        raise ValueError("GRPOConfig.padding_free=True cannot run: " + "; ".join(reasons))


def use_packed_attention(config: object) -> None:
    """Route the model's attention through ``grpokit_packed_<its implementation>``: packed calls (those with
    a layout) get ``packed_attention``, every other call the model's own implementation, with its own masks.
    Idempotent; the choice stays on the config, so that a checkpointed layer's recomputation in the backward
    attends as its forward did."""
    current = config._attn_implementation or "eager"
    if current.startswith(_PREFIX):
        return
    name = _PREFIX + current
    _register(name, current)
    config._attn_implementation = name


@functools.cache
def _register(name: str, original: str) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def dispatch(module, query, key, value, attention_mask, **kwargs):
        if kwargs.get(LAYOUT_ARGUMENT) is not None:
            return packed_attention(module, query, key, value, attention_mask, **kwargs)
        kwargs.pop(LAYOUT_ARGUMENT, None)
        return _original_attention(ALL_ATTENTION_FUNCTIONS, original)(
            module, query, key, value, attention_mask, **kwargs
        )

    AttentionInterface.register(name, dispatch)
    mask = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(original)
    if mask is not None:
        AttentionMaskInterface.register(name, mask)


def _original_attention(functions, name: str):
    if name == "eager":
        # eager has no registry entry: each modeling file defines its own, and those of PACKED_MODEL_TYPES
        # are the same computation as Llama's (repeat_kv, float32 softmax)
        from transformers.models.llama.modeling_llama import eager_attention_forward

        return eager_attention_forward
    return functions[name]
