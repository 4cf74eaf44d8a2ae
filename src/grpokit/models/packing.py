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
  then itself causally. The G completions of a group share one prefix, computed once (the CPU attention
  copies its keys/values into the batch of each run that reads them; no layer's input is copied).

The attention itself (``packed_attention``, the function a model's layers call once
``use_packed_attention`` has installed it) runs one ``scaled_dot_product_attention`` per run of consecutive
sequences of one length on one prefix (``PackedLayout.runs``), on views of the packed tensors: causal, or
under one float mask per prefix that every layer shares. Neither its compute nor what the backward saves
counts padding. On CUDA it takes ``flash_attn_varlen_func`` on the packed tensors when the ``flash-attn``
package is there and the model runs in half precision (its causal mask is aligned to the end of the keys,
which is what ``on_prefix`` needs), else one padded batch of the sequences (``PackedIndex``): a few kernel
launches instead of one per run and layer.
Calls without a layout go to the model's own attention unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from grpokit.models import recompute
from grpokit.models.parts import cache_argument
from grpokit.models.prefix_cache import RecordingCache

__all__ = [
    "PACKED_MODEL_TYPES",
    "PADDING_FREE_MIN_SAVING",
    "PackedIndex",
    "PackedLayout",
    "packed_attention",
    "packed_call",
    "packed_prompts",
    "packing_obstacles",
    "packing_supported",
    "padding_free_pays",
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

PADDING_FREE_MIN_SAVING = 0.1
"""A call runs packed (where nothing forces either way) when padding is at least this fraction of its padded
tokens: the training passes (``grpokit.train.forward``) and the fast sampler's prefill."""


def padding_free_pays(padded_tokens: float, real_tokens: float) -> bool:
    """Whether packing a call of ``padded_tokens`` (``real_tokens`` of them real) pays:
    ``PADDING_FREE_MIN_SAVING``."""
    return padded_tokens - real_tokens >= PADDING_FREE_MIN_SAVING * padded_tokens


@dataclass(frozen=True)
class PackedLayout:
    """Where each of S sequences' queries and keys lie in a packed call of T queries and K keys.

    The call's queries are the sequences' ``lengths`` laid one after another (T = their sum); its keys are
    the ``prefix_lengths`` of the prefixes packed in an earlier call (none for ``causal``), then the
    sequences' own. Sequence s continues prefix ``owners[s]`` (``owners`` is empty when there are no
    prefixes). What a kernel needs beyond that is derived once per call and shared by its layers:
    ``prefix_mask`` (the per-run attention's float mask) and ``index`` (the padded batch and
    ``flash-attn``'s offsets).
    """

    lengths: tuple[int, ...]
    prefix_lengths: tuple[int, ...] = ()
    owners: tuple[int, ...] = ()
    device: torch.device | str = "cpu"
    _masks: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def causal(cls, lengths: torch.Tensor) -> PackedLayout:
        """Sequences of ``lengths`` [S] laid one after another; each attends causally to itself."""
        return cls(tuple(lengths.tolist()), device=lengths.device)

    @classmethod
    def on_prefix(
        cls, prefix_lengths: torch.Tensor, owners: torch.Tensor, lengths: torch.Tensor
    ) -> PackedLayout:
        """Sequences of ``lengths`` [S] laid one after another, sequence s continuing prefix ``owners[s]`` of
        the ``prefix_lengths`` [S_p] prefixes packed before them (keys: the prefixes' K_p, then the
        sequences'). Sequence s sees all of its prefix, then itself causally."""
        device = lengths.device
        lengths, prefix_lengths, owners = (tuple(t.tolist()) for t in (lengths, prefix_lengths, owners))
        return cls(lengths, prefix_lengths, owners, device)

    def prefix_mask(self, prefix: int, dtype: torch.dtype) -> torch.Tensor:
        """[L, P + L] additive mask of a sequence continuing ``prefix`` (P tokens), L the longest sequence: 0
        where query j may attend key i (i <= P + j: the whole prefix, then its own keys causally), -inf
        elsewhere. A sequence of l queries reads its top-left ``[:l, :P + l]``. Built once per prefix and
        dtype and shared by the call's layers (a bool mask is converted to float, and saved, in every one)."""
        if (prefix, dtype) not in self._masks:
            longest, width = max(self.lengths), self.prefix_lengths[prefix]
            queries = torch.arange(longest, device=self.device)[:, None]  # [L, 1]
            keys = torch.arange(width + longest, device=self.device)[None, :]  # [1, P + L]
            zeros = torch.zeros(longest, width + longest, dtype=dtype, device=self.device)
            self._masks[prefix, dtype] = zeros.masked_fill(keys > width + queries, float("-inf"))
        return self._masks[prefix, dtype]

    @functools.cached_property
    def runs(self) -> tuple[tuple[int, int, int | None], ...]:
        """The sequences in order as runs of ``(count, length, prefix)``: consecutive sequences of one length
        continuing one prefix (None: none, or an empty one), empty sequences left out. A run is one batch of
        the per-run attention: every row of it real, none padded."""
        runs: list[list] = []
        for s, length in enumerate(self.lengths):
            owner = self.owners[s] if self.owners else None
            owner = owner if owner is not None and self.prefix_lengths[owner] > 0 else None
            if length == 0:
                continue
            if runs and runs[-1][1:] == [length, owner]:
                runs[-1][0] += 1
            else:
                runs.append([1, length, owner])
        return tuple((count, length, owner) for count, length, owner in runs)

    @functools.cached_property
    def index(self) -> PackedIndex:
        """The sequences' packed positions as index tensors (built on first use)."""
        return PackedIndex.of(self)


@dataclass(frozen=True)
class PackedIndex:
    """A ``PackedLayout`` as index tensors, for the kernels that take the sequences in one call.

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
    def of(cls, layout: PackedLayout) -> PackedIndex:
        """The index tensors of ``layout``, on its device."""
        device = layout.device
        lengths = torch.tensor(layout.lengths, dtype=torch.long, device=device)  # [S]
        if layout.owners:
            prefix_lengths = torch.tensor(layout.prefix_lengths, dtype=torch.long, device=device)  # [S_p]
            owners = torch.tensor(layout.owners, dtype=torch.long, device=device)  # [S]
        else:
            prefix_lengths, owners = torch.zeros_like(lengths), torch.arange(len(lengths), device=device)
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
        zero = torch.zeros(1, dtype=torch.int32, device=device)
        return cls(
            query_index=query_index,
            key_index=key_index,
            allowed=allowed[:, None],
            sequence_of=sequence_of,
            slot_of=slot_of,
            flat_keys=key_index[real_key],  # [sum Lk_s], row-major: sequence by sequence
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
    sequence of ``kwargs[LAYOUT_ARGUMENT]`` attending only to the keys its layout allows.

    On CUDA: ``flash_attn_varlen_func`` when the ``flash-attn`` package is there and the model runs in half
    precision, else one padded batch (few kernel launches). Elsewhere: one attention per sequence over its
    own real queries and keys (no padding computed or saved for the backward)."""
    layout: PackedLayout = kwargs[LAYOUT_ARGUMENT]  # type: ignore[assignment]
    if _flash_varlen_usable(query):
        return _flash_varlen(query, key, value, layout.index, dropout, scaling), None
    if query.is_cuda:
        return _padded_batch(query, key, value, layout.index, dropout, scaling), None
    return _per_run(query, key, value, layout, dropout, scaling), None


def _per_run(query, key, value, layout: PackedLayout, dropout: float, scaling) -> torch.Tensor:
    """One ``scaled_dot_product_attention`` per run of equal sequences (``PackedLayout.runs``), on views of
    the packed tensors: causal over each sequence's own keys, or over its prefix's keys then its own under
    ``prefix_mask`` (the prefix's keys copied once per sequence that reads them)."""
    prefixes = len(layout.prefix_lengths)
    sizes = [count * length for count, length, _ in layout.runs]
    queries = query[0].split(sizes, dim=1)  # [h, n*l, d] each
    keys = key[0].split(layout.prefix_lengths + tuple(sizes), dim=1)  # [kv, P or n*l, d] each
    values = value[0].split(layout.prefix_lengths + tuple(sizes), dim=1)
    grouped = {"enable_gqa": True} if query.shape[1] != key.shape[1] else {}
    outputs = []
    for r, (count, length, owner) in enumerate(layout.runs):
        q = queries[r].unflatten(1, (count, length)).transpose(0, 1)  # [n, h, l, d]
        k = keys[prefixes + r].unflatten(1, (count, length)).transpose(0, 1)  # [n, kv, l, d]
        v = values[prefixes + r].unflatten(1, (count, length)).transpose(0, 1)
        mask = None
        if owner is not None:
            k = torch.cat([keys[owner].expand(count, -1, -1, -1), k], dim=2)  # [n, kv, P + l, d]
            v = torch.cat([values[owner].expand(count, -1, -1, -1), v], dim=2)
            mask = layout.prefix_mask(owner, q.dtype)[:length, : k.shape[2]]  # [l, P + l]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=mask is None, scale=scaling, **grouped
        )  # [n, h, l, d]
        outputs.append(out.transpose(1, 2).flatten(0, 1))  # [n*l, h, d]
    if not outputs:
        return query.new_zeros(1, 0, query.shape[1], query.shape[3])
    joined = torch.cat(outputs)[None]  # [1, T, h, d]
    if recompute.active() and torch.is_grad_enabled():  # the output projection keeps the runs' outputs,
        recompute.offer(joined, lambda: torch.cat(outputs)[None], *outputs)  # which the SDPAs keep anyway
    return joined


def _padded_batch(query, key, value, index: PackedIndex, dropout: float, scaling) -> torch.Tensor:
    """The sequences gathered into one batch padded to the longest, masked by ``index.allowed``."""
    q = query[0][:, index.query_index].transpose(0, 1)  # [S, h, Lq, d]
    k = key[0][:, index.key_index].transpose(0, 1)  # [S, kv, Lk, d]
    v = value[0][:, index.key_index].transpose(0, 1)  # [S, kv, Lk, d]
    grouped = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=index.allowed, dropout_p=dropout, scale=scaling, **grouped
    )  # [S, h, Lq, d]
    return out[index.sequence_of, :, index.slot_of][None]  # [1, T, h, d]


def _flash_varlen_usable(query: torch.Tensor) -> bool:
    return query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and _flash_varlen() is not None


@functools.cache
def _flash_varlen():
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def _flash_varlen(query, key, value, index: PackedIndex, dropout: float, scaling) -> torch.Tensor:
    """``flash_attn_varlen_func`` over the packed queries and each sequence's keys laid one after another (a
    prefix gathered once per sequence that reads it); causal, aligned to the end of each sequence's keys."""
    q = query[0].transpose(0, 1)  # [T, h, d]
    k = key[0][:, index.flat_keys].transpose(0, 1)  # [sum Lk, kv, d]
    v = value[0][:, index.flat_keys].transpose(0, 1)
    out = _flash_varlen()(
        q, k, v, index.cu_queries, index.cu_keys, index.max_queries, index.max_keys,
        dropout_p=dropout, softmax_scale=scaling, causal=True,
    )  # fmt: skip  # [T, h, d]
    return out[None]  # [1, T, h, d]


def packed_call(lengths: torch.Tensor, layout: PackedLayout | None = None) -> dict[str, object]:
    """The keywords of a packed backbone call: its layout (each of the sequences of ``lengths`` [S] causal
    by default), and a 4D attention mask that stops ``transformers`` from building a [T, T] one (the packed
    attention never reads it)."""
    layout = PackedLayout.causal(lengths) if layout is None else layout
    unused = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=lengths.device)
    return {LAYOUT_ARGUMENT: layout, "attention_mask": unused}


def packed_prompts(
    decoder: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor
) -> tuple[RecordingCache, torch.Tensor]:
    """The prompts ``prompt_ids`` / ``prompt_mask`` [P, L] (left-padded) run by ``decoder`` (a backbone)
    packed over their real tokens, positions from 0, each attending only to itself. Returns the recording
    of each layer's keys/values ([1, kv, T, d], the prompts' real tokens one after another) and each
    prompt's last hidden state [P, H] (which predicts its first completion token)."""
    use_packed_attention(decoder.config)
    real = prompt_mask.bool()  # [P, L]
    lengths = real.sum(dim=1)  # [P]
    positions = real.long().cumsum(dim=1) - 1  # [P, L]
    recording = RecordingCache(decoder.config.num_hidden_layers)
    out = decoder(
        input_ids=prompt_ids[real][None], position_ids=positions[real][None], use_cache=True,
        **cache_argument(decoder, recording), **packed_call(lengths),
    )  # fmt: skip
    return recording, out.last_hidden_state[0][lengths.cumsum(0) - 1]


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
