"""The fast sampler's decode step for Llama-family decoders (``llama``, ``qwen2``, ``qwen3``, ``mistral``
without a sliding window): the prompt cache kept once per prompt and shared by the G samples of its group,
the generated keys/values in pre-allocated buffers, fused projections built from the live weights."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

from grpokit.models.cpu_linear import cpu_family, onednn_ops
from grpokit.models.parts import autocast_dtype, decoder_of, linear_weight

__all__ = [
    "NATIVE_MODEL_TYPES",
    "NativeDecoder",
    "call_packs",
    "native_supported",
    "pack_weight",
    "packed_fp32_min_rows",
    "packed_linear",
    "packing_pays",
    "packs_weights",
]

NATIVE_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "qwen2_moe", "qwen3_moe", "mixtral")
"""Decoders the native decode runs: the Llama family, and its mixtures of experts (Qwen2-MoE, Qwen3-MoE,
Mixtral), whose expert blocks run as the model's own modules (``transformers``' grouped expert matmul: one
call over the N rows per layer, no loop over tokens)."""


class NativeDecoder:
    """Decode step for Llama-family decoders with the prompt cache shared by the G samples of a group.

    Attention of the N = P*G query rows is split in two: over the prompt keys (kept once per prompt, [P, kv,
    L, d]; one matmul per group with the G*n_rep queries of that group stacked) and over the generated keys
    (pre-allocated [N, kv, max_new, d]). Both score blocks are joined before one softmax, so the result is the
    plain softmax attention over [prompt, generated] keys.
    """

    def __init__(
        self,
        model: nn.Module,
        pre: Any,
        group: int,
        max_new: int,
        *,
        compiled: bool = False,
    ) -> None:
        """The products run on weights packed for oneDNN where ``packs_weights`` and ``packing_pays`` say so,
        unless ``compiled``: the step runs through ``torch.compile`` (``compile_decode``), which traces plain
        tensors, its shapes dynamic. Then the model's own sizes in the decoder's tensors (heads, head width)
        are marked static, so that it never takes a size of the call (prompts x kv heads, rows, prompt
        length) as equal to one of them and compiles again when they part."""
        self.model = model
        self.compiled = compiled
        self.base = decoder_of(model)
        self.head = model.get_output_embeddings()
        self.embed = model.get_input_embeddings()
        self.group = group
        first = self.base.layers[0].self_attn
        self.head_dim = first.head_dim
        self.n_rep = first.num_key_value_groups
        self.scaling = first.scaling
        num_prompts, kv_heads, _, d = pre.keys[0].shape
        self.kv_heads = kv_heads
        rows = num_prompts * group
        device = pre.keys[0].device
        # The dtype of every product (None: each weight's own). Under autocast the attention's products take
        # their operands in it, so the caches are kept in it: each key cast once, where it is written, instead
        # of autocast casting every layer's whole cache at every step (the same numbers).
        compute = autocast_dtype(device)
        self.compute = compute
        self.cache_dtype = compute or pre.keys[0].dtype
        # Pre-allocated caches of the generated tokens, one [N, kv, max_new, d] pair per layer.
        self.gen_k = [self._cache_buffer(rows, max_new, d, device) for _ in pre.keys]
        self.gen_v = [self._cache_buffer(rows, max_new, d, device) for _ in pre.keys]
        self.positions = pre.lengths.repeat_interleave(group)[:, None]  # [N, 1] next position per row
        self._set_prompts(list(pre.keys), list(pre.values), pre.pad_bias)  # the prompt cache, per layer
        self.rows = rows  # rows in the decode batch: the first ``rows`` of the buffers
        # Each row's place in the [prompts x G] grid: its prompt and its place in the group, [rows] each
        # (None: every row of every prompt, in order: no finished row has left yet).
        self.slot_prompt: torch.Tensor | None = None
        self.slot_member: torch.Tensor | None = None
        # Rotary positions of the q and k heads in one pass (``_rope``): per head, the factor of cos and the
        # signed factor of sin; the q heads' carry the attention's scaling, so no score is scaled again.
        heads = kv_heads * self.n_rep
        scale = torch.tensor([self.scaling] * heads + [1.0] * kv_heads, dtype=torch.float64)[:, None]
        sign = torch.cat([-torch.ones(d // 2), torch.ones(d - d // 2)]).double()  # rotate_half's signs
        self.cos_scale = scale.to(device=device, dtype=torch.float32)  # [h+kv, 1]
        self.sin_scale = (scale * sign).to(device=device, dtype=torch.float32)  # [h+kv, d]
        if compiled:
            _model_sizes_static([self.cos_scale, self.sin_scale], 0, 1)
            _model_sizes_static(self.gen_k + self.gen_v, 1, 3)
        # Fused projections (one matmul instead of three, resp. two), rebuilt from the live weights per call.
        # Under autocast every weight the step applies is cast here once, to the dtype autocast would cast
        # it to at each step (the sampler runs in inference mode, where autocast keeps no cast of its own).
        # Where it pays (``packs_weights``, ``packing_pays``), each weight is then also packed once into
        # oneDNN's layout (``_pack``); not where autocast runs without its dtype here (only a test of the
        # casts does that), as autocast does not cast the input of a packed product.
        layers = self.base.layers
        attentions = [layer.self_attn for layer in layers]
        pack = not compiled and (compute is not None or not torch.is_autocast_enabled(device.type))
        pack = pack and call_packs(device, compute or self.embed.weight.dtype, rows, max_new)
        self.packed_rows = packed_fp32_min_rows()  # fewer float32 rows run by columns, packed or not

        def prepared(weights: Weights | None) -> Weights | None:
            return None if weights is None else _pack(weights, rows) if pack else weights

        self.qkv = [
            prepared(_cast(*_fuse_linear(a.q_proj, a.k_proj, a.v_proj), dtype=compute)) for a in attentions
        ]
        fused_mlps = [_fuse_mlp(layer.mlp) for layer in layers]
        self.gate_up = [None if w is None else prepared(_cast(w, dtype=compute)) for w in fused_mlps]
        self.o_proj = [prepared(_cast_linear(a.o_proj, compute)) for a in attentions]
        self.down_proj = [None if w is None else prepared(_cast_linear(layer.mlp.down_proj, compute))
                          for layer, w in zip(layers, fused_mlps, strict=True)]  # fmt: skip
        self.head_weights = prepared(_cast_linear(self.head, compute))

    def _cache_buffer(self, rows: int, max_new: int, d: int, device: torch.device) -> torch.Tensor:
        """One layer's keys or values of the generated tokens, [N, kv, max_new, d] (written step by step)."""
        return torch.empty(rows, self.kv_heads, max_new, d, dtype=self.cache_dtype, device=device)

    def _set_prompts(
        self, keys: list[torch.Tensor], values: list[torch.Tensor], pad_bias: torch.Tensor
    ) -> None:
        """The prompt cache, per layer [P, kv, L, d], kept as [P*kv, L, d] (one batch of products per kv
        head of each prompt) in ``cache_dtype``, and the left padding's bias [P, 1, 1, L] as [P*kv, 1, L]."""
        num_prompts, kv_heads, length, d = keys[0].shape
        batch = num_prompts * kv_heads
        self.prompt_keys = [k.reshape(batch, length, d).to(self.cache_dtype) for k in keys]
        self.prompt_values = [v.reshape(batch, length, d).to(self.cache_dtype) for v in values]
        bias = pad_bias.to(self.cache_dtype).reshape(num_prompts, 1, length)  # [P, 1, L]
        self.prompt_bias = bias.repeat_interleave(kv_heads, dim=0)  # [P*kv, 1, L]
        if self.compiled:
            _model_sizes_static(self.prompt_keys + self.prompt_values, 2)

    def keep(self, running: torch.Tensor, t: int) -> torch.Tensor:
        """Let the finished rows leave the decode batch after step ``t``'s tokens were sampled: ``running``
        [n] bool over the batch's rows. Returns ``order`` [n'], the old place of each row that stays (its new
        place is its index in ``order``).

        Rows that stay behind the new end move into the places of finished rows before it (their generated
        keys/values up to step t are copied: only as many rows as left), and a prompt none of whose rows
        runs any more leaves the prompt cache."""
        device = running.device
        stay = int(running.sum())
        order = torch.arange(stay, device=device)
        holes = (~running[:stay]).nonzero().squeeze(1)  # places freed before the new end
        movers = running[stay:].nonzero().squeeze(1) + stay  # running rows behind it
        order[holes] = movers
        if len(holes):
            for buffers in (self.gen_k, self.gen_v):
                for buffer in buffers:  # [N, kv, max_new, d]
                    buffer[holes, :, : t + 1] = buffer[movers, :, : t + 1]
        self.positions = self.positions[order]
        if self.slot_prompt is None:
            places = torch.arange(self.rows, device=device)
            self.slot_prompt, self.slot_member = places // self.group, places % self.group
        self.slot_prompt, self.slot_member = self.slot_prompt[order], self.slot_member[order]
        self.rows = stay
        self._drop_finished_prompts()
        return order

    def _drop_finished_prompts(self) -> None:
        alive = torch.unique(self.slot_prompt)  # sorted
        num_prompts = self.prompt_bias.shape[0] // self.kv_heads
        if len(alive) == num_prompts:
            return
        length, d = self.prompt_keys[0].shape[1:]

        def kept(cache: list[torch.Tensor]) -> list[torch.Tensor]:
            return [c.view(num_prompts, self.kv_heads, length, d)[alive] for c in cache]

        bias = self.prompt_bias.view(num_prompts, self.kv_heads, 1, length)[alive, :1]  # [P', 1, 1, L]
        self._set_prompts(kept(self.prompt_keys), kept(self.prompt_values), bias)
        self.slot_prompt = torch.searchsorted(alive, self.slot_prompt)  # [n] its place among the alive

    def __call__(self, tokens: torch.Tensor, t: int) -> torch.Tensor:
        """Feed the token sampled at step t ([n], one per row of the decode batch); return next-token logits
        [n, V] (float32)."""
        h = self.embed(tokens[:, None])  # [N, 1, H]
        cos, sin = self.base.rotary_emb(h, self.positions + t)  # [N, 1, d]
        # per head [N, h+kv, d], the q heads' scaled; computed in float32, then in the tables' dtype
        cos = (cos.float() * self.cos_scale).to(cos.dtype)
        sin = (sin.float() * self.sin_scale).to(sin.dtype)
        for i, layer in enumerate(self.base.layers):
            x = self._attention(layer.self_attn, _rms_norm(layer.input_layernorm, h), cos, sin, i, t)
            h = self._apply(layer.self_attn.o_proj, self.o_proj[i], x, residual=h)
            x = _rms_norm(layer.post_attention_layernorm, h)
            fused = self.gate_up[i]
            if fused is None:
                h = h + layer.mlp(x)
            else:
                gate, up = self._linear(x, fused).chunk(2, dim=-1)
                h = self._apply(
                    layer.mlp.down_proj, self.down_proj[i], layer.mlp.act_fn(gate) * up, residual=h
                )
        h = _rms_norm(self.base.norm, h)[:, 0]  # [N, H]
        return self._apply(self.head, self.head_weights, h).float()  # [N, V]

    def _linear(
        self, x: torch.Tensor, weights: Weights, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``F.linear(x, *weights)`` for x [N, 1, in] or [N, in], plus ``residual`` where given: on packed
        weights by oneDNN (x cast to their dtype, as autocast casts it; a float32 residual added by the
        product itself), else in the orientation ``_by_columns`` picks for the dtype."""
        rows = x.shape[0]
        weight, bias = weights.weight, weights.bias
        if weights.packed is not None and (rows >= self.packed_rows or weight.dtype != torch.float32):
            if residual is not None and residual.dtype == weight.dtype == torch.float32:
                return packed_linear_add(x, weights.packed, bias, residual)
            out = packed_linear(x, weights.packed, bias)
        elif not _by_columns(x.device, self.compute or weight.dtype):
            out = torch.nn.functional.linear(x, weight, bias)
        else:
            out = _linear_by_columns(weight, bias, x.reshape(rows, x.shape[-1])).view(*x.shape[:-1], -1)
        return out if residual is None else residual + out

    def _apply(
        self,
        module: nn.Module,
        weights: Weights | None,
        x: torch.Tensor,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``module(x)`` (plus ``residual`` where given), or the linear map by its weights (``_cast_linear``);
        outside autocast the input is cast to the weight's dtype first, as a head made float32 by
        ``cast_lm_head_to_fp32`` casts it."""
        if weights is None:
            return module(x) if residual is None else residual + module(x)
        if not torch.is_autocast_enabled(x.device.type):
            x = x.to(weights.weight.dtype)
        return self._linear(x, weights, residual)

    def _attention(self, attn: nn.Module, x: torch.Tensor, cos, sin, i: int, t: int) -> torch.Tensor:
        """Self-attention of the decode batch's rows at step t (x [N, 1, H]), before the output projection:
        [N, 1, h*d]. The rotary tables ``cos``, ``sin`` [N, h+kv, d] scale the q heads (``__init__``)."""
        rows = x.shape[0]
        d, kvh, rep, group = self.head_dim, self.kv_heads, self.n_rep, self.group
        heads = kvh * rep
        qkv = self._linear(x, self.qkv[i]).view(rows, heads + 2 * kvh, d)  # [N, h+2kv, d]
        qk, v = qkv[:, : heads + kvh], qkv[:, heads + kvh :]  # [N, h+kv, d], [N, kv, d]
        if hasattr(attn, "q_norm"):
            qk = torch.cat([_rms_norm(attn.q_norm, qk[:, :heads]), _rms_norm(attn.k_norm, qk[:, heads:])], 1)
        qk = _rope(qk, cos, sin)  # q scaled
        q, k = qk[:, :heads], qk[:, heads:]  # [N, h, d], [N, kv, d]
        q = q.to(self.cache_dtype)  # once, as autocast would at each of its two products
        # position t written as a slice: an integer index would make torch.compile specialise on t
        self.gen_k[i][:rows, :, t : t + 1] = k[:, :, None]
        self.gen_v[i][:rows, :, t : t + 1] = v[:, :, None]
        gk = self.gen_k[i][:rows, :, : t + 1]  # [N, kv, t+1, d]
        gv = self.gen_v[i][:rows, :, : t + 1]
        pk, pv = self.prompt_keys[i], self.prompt_values[i]  # [P*kv, L, d]
        num_prompts, plen = pk.shape[0] // kvh, pk.shape[1]
        grid = (num_prompts, group, kvh, rep)  # the [P x G] grid of rows, by kv head and its query heads
        # Over the prompt, left padding masked by the bias:
        q_grid = self._by_prompt(q.view(rows, kvh, rep, d), num_prompts)  # [P*kv, G*rep, d]
        s_prompt = torch.baddbmm(self.prompt_bias, q_grid, pk.transpose(1, 2))  # [P*kv, G*rep, L]
        s_prompt = s_prompt.view(num_prompts, kvh, group, rep, plen).transpose(1, 2)  # [P, G, kv, rep, L]
        s_gen = torch.matmul(q.view(rows, kvh, rep, d), gk.transpose(-1, -2))  # [N, kv, rep, t+1]
        if self.slot_prompt is None:
            scores = torch.cat([s_prompt, s_gen.view(*grid, -1)], dim=-1).view(rows, kvh, rep, -1)
        else:
            scores = torch.cat([s_prompt[self.slot_prompt, self.slot_member], s_gen], dim=-1)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)  # [N, kv, rep, L+t+1]
        o_prompt = torch.bmm(self._by_prompt(probs[..., :plen], num_prompts), pv)  # [P*kv, G*rep, d]
        o_prompt = o_prompt.view(num_prompts, kvh, group, rep, d).transpose(1, 2)  # [P, G, kv, rep, d]
        out = torch.matmul(probs[..., plen:], gv)  # [N, kv, rep, d]
        if self.slot_prompt is None:
            out.view(*grid, d).add_(o_prompt)
        else:
            out.add_(o_prompt[self.slot_prompt, self.slot_member])
        return out.view(rows, 1, heads * d)

    def _by_prompt(self, x: torch.Tensor, num_prompts: int) -> torch.Tensor:
        """The rows' x [n, kv, rep, w] as the batches of the products over the prompt, [P*kv, G*rep, w]: per
        prompt and kv head, the G*rep rows of its group (as repeat_kv: query head h = kv*rep + r reads kv
        head kv). Where rows have left, their places hold zeros (their results are never read)."""
        _, kv_heads, rep, width = x.shape
        if self.slot_prompt is None:
            grid = x.view(num_prompts, self.group, kv_heads, rep, width).transpose(1, 2)  # [P, kv, G, rep, w]
        else:
            grid = x.new_zeros(num_prompts, kv_heads, self.group, rep, width)
            grid.transpose(1, 2)[self.slot_prompt, self.slot_member] = x
        return grid.reshape(num_prompts * kv_heads, self.group * rep, width)


def _model_sizes_static(tensors: list[torch.Tensor], *dims: int) -> None:
    """Mark ``dims`` of each tensor static for ``torch.compile`` (sizes of the model, not of the call)."""
    for tensor in tensors:
        for dim in dims:
            torch._dynamo.mark_static(tensor, dim)


def _fuse_linear(*linears: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[W_1; W_2; ...] and the joined biases, from the weights the layers apply (LoRA included)."""
    weights = [linear_weight(lin) for lin in linears]
    biases = [lin.bias for lin in linears]
    if all(b is None for b in biases):
        return torch.cat(weights), None
    joined = [b if b is not None else w.new_zeros(w.shape[0]) for b, w in zip(biases, weights)]
    return torch.cat(weights), torch.cat(joined)


def _fuse_mlp(mlp: nn.Module) -> torch.Tensor | None:
    """[gate; up] weight for a gated MLP ``down(act(gate x) * up x)`` without biases, else None."""
    parts = [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    if any(p is None or getattr(p, "bias", None) is not None for p in parts) or not hasattr(mlp, "act_fn"):
        return None
    return torch.cat([linear_weight(parts[0]), linear_weight(parts[1])])


class Weights(NamedTuple):
    """A linear map as the decode step applies it."""

    weight: torch.Tensor
    """[out, in]"""
    bias: torch.Tensor | None = None
    """[out] or None"""
    packed: torch.Tensor | None = None
    """The weight in oneDNN's blocked layout (``_pack``), where the call packs its weights; else None."""


def _cast(weight: torch.Tensor, bias: torch.Tensor | None = None, *, dtype: torch.dtype | None) -> Weights:
    """``(weight, bias)`` as autocast's ``linear`` uses them: cast to ``dtype`` (None: autocast is off, kept
    as they are). Autocast leaves a tensor already in its dtype as it is, so a linear over the cast weights
    gives the same result as over the originals."""
    if dtype is None:
        return Weights(weight, bias)
    return Weights(weight.to(dtype), None if bias is None else bias.to(dtype))


def _linear_weights(module: nn.Module) -> Weights | None:
    """A linear layer's floating-point ``(weight, bias)``; None where one weight cannot express the layer
    (``linear_weight``)."""
    weight = linear_weight(module)
    if weight is None or not weight.is_floating_point():
        return None
    base = module.get_base_layer() if hasattr(module, "get_base_layer") else module
    return Weights(weight, base.bias)


def _cast_linear(module: nn.Module, dtype: torch.dtype | None) -> Weights | None:
    """A linear layer's weight and bias as the decode step applies them: cast once for the whole call under
    autocast (``_cast``); outside it, a plain ``nn.Linear``'s own. None where ``_linear_weights`` has none, or
    where they would be a new tensor outside autocast (a LoRA layer): the module then runs itself."""
    if dtype is None:
        return Weights(module.weight, module.bias) if type(module) is nn.Linear else None
    weights = _linear_weights(module)
    return None if weights is None else _cast(weights.weight, weights.bias, dtype=dtype)


def packs_weights(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the decode step runs its products in ``dtype`` on weights packed once per sampling call into
    oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, then ``_linear_pointwise``: the
    kernels ``torch.compile`` uses for CPU linears). True on an x86 CPU where torch has the two operators,
    for float32 with AVX2 or AVX-512 and for bfloat16 with AVX-512 where oneDNN computes it natively: with few
    rows a product reads its whole weight from memory, and MKL's, on the unpacked weight, runs at a fraction
    of that rate at most row counts. The 120 projections of SmolLM2-135M's 30 layers, ms by columns against
    packed (``python benchmarks/decode_orientation.py``, 2-core AMD EPYC):
    - AVX-512 (Zen 4; ``benchmarks/results/decode-products-2026-12-05.txt``): float32 14 rows 72 and 23, 32
      rows 66 and 40; its LM head with 14 rows 22 and 5.0; bfloat16 by rows, 14 rows 26 and 15.
    - AVX2 (``decode-products-avx2-2026-12-05.txt``): float32 14 rows 131 and 77, 32 rows 163 and 150; the LM
      head 14 rows 34 and 16. oneDNN refuses bfloat16 there, whose products by rows run 3-5x slower than
      float32's with 8-64 rows anyway.
    With 1-2 rows float32 runs by columns on the plain weight where that is faster (``packed_fp32_min_rows``).
    Other processors (ARM) were not measured: their products run as before (``_by_columns``)."""
    if device.type != "cpu" or not onednn_ops("_reorder_linear_weight", "_linear_pointwise"):
        return False
    capability = torch.backends.cpu.get_cpu_capability()
    if dtype == torch.float32:
        return capability.startswith(("AVX512", "AVX2"))
    if dtype == torch.bfloat16:
        return capability.startswith("AVX512") and _onednn_bf16()
    return False


def _onednn_bf16() -> bool:
    """Whether oneDNN runs bfloat16 products natively on this CPU (AVX-512 BW/VL/DQ or AVX-NE-CONVERT)."""
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return supported is not None and bool(supported())


def packing_pays(
    dtype: torch.dtype,
    rows: int,
    max_new: int,
    capability: str | None = None,
    min_rows: int | None = None,
) -> bool:
    """Whether a sampling call of ``rows`` rows and up to ``max_new`` tokens gains from packing its weights
    (where ``packs_weights`` allows it): the packing costs about as much as a few decode steps save. Whole
    decode steps of SmolLM2-135M packed and not (``python benchmarks/decode_rows.py [--unpacked]``), 2-core
    AMD EPYC:
    - AVX-512 (Zen 4): packing every weight takes 0.19-0.23 s in float32 and 0.08 s in bfloat16; a float32
      step saves 7 ms with 3-4 rows and 24-66 ms with 8-64, a bfloat16 step 12-23 ms at any row count
      (``benchmarks/results/decode-packing-cost-2026-12-05.txt``, ``decode-products-2026-12-05.txt``). So
      float32 from 8 tokens with 8 rows or more, from 32 tokens with 3-7 rows; bfloat16 from 8 tokens.
      1-2 float32 rows run by columns on the plain weights there, packed or not.
    - AVX-512 (Zen 5): packing takes 0.12-0.22 s in float32; a step with 1-2 rows, which run packed there
      (``packed_fp32_min_rows``), saves 2.5-5 ms (``decode-rows-few-zen5-2026-12-07.txt``): from 64 tokens.
    - AVX2: packing takes 0.28-0.30 s in float32; a step saves 11-12 ms with 8 rows, 12-33 ms with 16, 45-74
      ms with 32-64, and with 3-4 rows between -11 and +15 ms (``decode-rows-packed-avx2-2026-12-05.txt``).
      So float32 from 32 tokens with 8-15 rows, from 16 tokens with 16 rows or more.

    ``capability``: the processor's, as ``torch.backends.cpu.get_cpu_capability()`` names it (None: this
    machine's); ``min_rows``: ``packed_fp32_min_rows``'s answer for it (None: this machine's)."""
    if dtype != torch.float32:
        return max_new >= 8
    capability = capability or torch.backends.cpu.get_cpu_capability()
    if not capability.startswith("AVX512"):
        return rows >= 8 and max_new >= (16 if rows >= 16 else 32)
    min_rows = min_rows or packed_fp32_min_rows()
    return rows >= min_rows and max_new >= (8 if rows >= 8 else 32 if rows >= 3 else 64)


def packed_fp32_min_rows(family: tuple[str, int] | None = None) -> int:
    """The fewest rows of a float32 product that the decode step runs on packed weights (in a call that
    packs them); fewer run by columns on the plain weight (``_linear_by_columns``). ``family``: the
    processor's vendor and family (``grpokit.models.cpu_linear.cpu_family``; None: this machine's).

    1 on AMD's Zen 5 (family 26), 3 elsewhere. The 120 projections of SmolLM2-135M's 30 layers and its LM
    head, ms by columns against packed (``python benchmarks/decode_orientation.py``, 2-core AMD EPYC):
    - Zen 4: 1 row 13.6 + 2.8 against 17.3 + 3.0, 2 rows 13.6 + 3.2 against 19.7 + 4.2; 3 rows 22.0 + 5.2
      against 16.8 + 3.5 (``benchmarks/results/decode-products-2026-12-05.txt``).
    - Zen 5: 1 row 11.0-11.7 + 2.4 against 8.6-10.6 + 1.4-1.9, 2 rows 10.8-11.3 + 2.5 against 8.6-8.8 + 1.5;
      whole decode steps with 1 row 14.5-17.2 ms packed against 18.4-20.9 by columns, with 2 rows 16.0-18.5
      against 20.7-23.0 (``decode-rows-few-zen5-2026-12-07.txt``; the weight packed for 1, 2 or 32 rows
      alike).
    Other processors (Intel's, AVX2-only ones: packed float32 needs 8 rows to pay there anyway) were not
    measured with 1-2 rows packed: 3, as before."""
    if family is None:
        family = cpu_family()
    return 1 if family == ("AuthenticAMD", 26) else 3


def call_packs(device: torch.device, dtype: torch.dtype, rows: int, max_new: int) -> bool:
    """Whether a sampling call of ``rows`` rows and up to ``max_new`` tokens, its products in ``dtype`` on
    ``device``, packs the weights its decode applies: where the processor allows it (``packs_weights``) and
    the call can repay it (``packing_pays``). The decoder and ``grpokit plan`` both ask here."""
    return packs_weights(device, dtype) and packing_pays(dtype, rows, max_new)


def _pack(weights: Weights, rows: int) -> Weights:
    """``weights`` with their weight also packed for oneDNN's products of about ``rows`` rows, where
    ``packs_weights`` says so (a new tensor), else as they are."""
    weight, bias = weights.weight, weights.bias
    if not packs_weights(weight.device, weight.dtype) or (bias is not None and bias.dtype != weight.dtype):
        return weights
    return weights._replace(packed=pack_weight(weight, rows))


def pack_weight(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """``weight`` [out, in] as a new tensor in oneDNN's blocked layout for products of about ``rows`` rows
    (where ``packs_weights`` holds), for ``packed_linear``."""
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), max(rows, 2))


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` on a weight packed by ``pack_weight``, x [..., in] cast to its dtype."""
    return torch.ops.mkldnn._linear_pointwise(x.to(weight.dtype).contiguous(), weight, bias, "none", [], "")


def packed_linear_add(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor
) -> torch.Tensor:
    """``residual + F.linear(x, weight, bias)`` in one product on a weight packed by ``pack_weight`` (oneDNN's
    sum post-op), x [..., in] and ``residual`` [..., out] in the weight's dtype."""
    return torch.ops.mkldnn._linear_pointwise.binary(
        x.contiguous(), residual.contiguous(), weight, bias, "add"
    )


def _by_columns(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the decode step's linear maps on weights not packed (``packs_weights``; in float32 also on
    packed ones, with fewer rows than ``packed_fp32_min_rows``) run by columns (``_linear_by_columns``) for
    products in ``dtype`` on ``device``; else by rows, as ``F.linear``. True for float32 on a CPU:
    there MKL runs SmolLM2-135M's four projections over its 30 layers, their weights read from memory
    as in decode, 2.0-3.4x faster by columns with 1-4 rows (1.2-1.5x with 8-64), and a decode step of the
    whole model takes 0.4-0.7x of its time by rows with 1-4 rows, 0.8-1.0x with 16-32
    (``benchmarks/results/decode-orientation-2026-12-05.txt``). bfloat16 gains nothing measurable in the
    whole step, and other devices were not measured: by rows."""
    return device.type == "cpu" and dtype == torch.float32


def _linear_by_columns(weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for x [n, in] as ``(weight @ x.T).T`` ([n, out], contiguous): the same
    product in the other orientation. One row is computed as two equal ones: MKL's one-column product
    (a matrix-vector product) reads the weight at a third to a half of the rate of its two-column one."""
    rows = x.shape[0]
    if rows == 1:
        x = torch.cat([x, x])  # [2, in]
    out = weight @ x.T  # [out, n]
    if bias is not None:
        out = out + bias[:, None]
    return out[:, :rows].T.contiguous()


RMS_NORMS = frozenset(
    f"{name}RMSNorm" for name in ("Llama", "Qwen2", "Qwen3", "Mistral", "Qwen2Moe", "Qwen3Moe", "Mixtral")
)
"""``transformers``' RMSNorm classes of the decoders the native decode runs, all computing ``weight *
(x / rms(x))`` in float32 as ``LlamaRMSNorm`` does; ``_rms_norm`` runs their arithmetic itself."""


def _rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)``, for the classes of ``RMS_NORMS`` with their arithmetic in fewer operators (bit for bit:
    ``mean`` is a sum divided by the width, and costs a cast of its own besides); other norms run as
    themselves."""
    if type(norm).__name__ not in RMS_NORMS:
        return norm(x)
    x32 = x.float()
    variance = torch.sum(x32 * x32, dim=-1, keepdim=True).div_(x.shape[-1])  # [..., 1]
    return norm.weight * (x32 * variance.add_(norm.variance_epsilon).rsqrt_()).to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions of x [N, heads, d] (q and k heads together): ``x * cos + rotate_half(x) * sin`` as
    ``transformers`` computes it, with ``rotate_half(x) = [-x2, x1]`` written as the halves swapped times
    ``sin`` signed per half (``sin`` [N, heads, d] carries the sign: ``NativeDecoder.__init__``)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


def native_supported(model: nn.Module) -> bool:
    """True for Llama-family decoders whose every layer is full causal attention with rotary positions; for
    a vision-language model, its language model's (LLaVA over Llama, Qwen2 or Mistral)."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "vision_config") and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    if config is None or getattr(config, "model_type", None) not in NATIVE_MODEL_TYPES:
        return False
    if any(lt != "full_attention" for lt in (getattr(config, "layer_types", None) or ["full_attention"])):
        return False
    if config.model_type == "mistral" and getattr(config, "sliding_window", None) is not None:
        return False
    if getattr(config, "use_sliding_window", False):
        return False
    base = decoder_of(model) if hasattr(model, "base_model") else None
    needed = ("layers", "norm", "rotary_emb")
    if base is None or not all(hasattr(base, n) for n in needed):
        return False
    layer = base.layers[0]
    attn = getattr(layer, "self_attn", None)
    shaped = all(hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm", "mlp")) and all(
        hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "num_key_value_groups")
    )
    return shaped and all(_fusable(layer) for layer in base.layers)


def _fusable(layer: nn.Module) -> bool:
    """Whether the projections the decoder fuses are each one weight (plain, or LoRA: see ``linear_weight``).
    A gated MLP that is not fusable still runs as its own module; a LoRA variant there is refused too, so a
    model with DoRA-like adapters is decoded by the generic path."""
    attn, mlp = layer.self_attn, layer.mlp
    projections = [attn.q_proj, attn.k_proj, attn.v_proj]
    projections += [getattr(mlp, n) for n in ("gate_proj", "up_proj") if hasattr(mlp, n)]
    return all(linear_weight(p) is not None for p in projections)
