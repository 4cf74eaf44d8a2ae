"""The chunked LM head of the training forward: per-token log-probs (and entropy) of the completion tokens
from the backbone's hidden states, without a [M, V] logits tensor (``grpokit.train.forward`` point 2)."""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch.autograd.function import once_differentiable

from grpokit.models.cpu_linear import linear, matmul, onednn_float32
from grpokit.models.parts import autocast_dtype, cast
from grpokit.models.policy import FP32_HEAD
from grpokit.models.transient import transient_blocks

__all__ = ["HEAD_CHUNK_BYTES", "HEAD_CHUNK_ROWS", "head_chunk_rows", "head_logprobs"]

HEAD_CHUNK_BYTES = 32 * 2**20
"""Float32 bytes of one chunk's logits [rows, V] (32 MiB): ``head_chunk_rows``' budget."""
HEAD_CHUNK_ROWS = 512
"""Most rows (completion positions) per LM-head chunk: the chunk's float32 logits are [rows, V]."""
WEIGHT_GRADIENT_ROWS = 4096
"""Rows of the head's [V, H] weight gradient whose float32 product oneDNN computes at a time in the backward
(``_add_weight_gradient``): a chunk's product is added to the sum in blocks this tall (SmolLM2: 9 MiB each;
as fast as one [V, H] product: 31.5 against 30 ms)."""


def head_chunk_rows(vocab_size: int) -> int:
    """LM-head rows per chunk: as many as keep the chunk's float32 logits within ``HEAD_CHUNK_BYTES``, between
    32 and ``HEAD_CHUNK_ROWS`` (8,000 words: 512 rows; 49,152: 170; 152,064: 55).

    Each chunk's product reads the head's whole [V, H] weight, so the product runs at the matmul rate only
    with enough rows: SmolLM2-135M's [rows, 576] x [576, 49,152] ran at 117 GFLOP/s with 85 rows, 156 with
    170, 168 with 512 in MKL's product (a 2-core Zen 5 EPYC, where MKL's square products run at ~205;
    oneDNN's, which a float32 head uses there, ran at 411 with 170 rows). Each pass allocates its [rows, V]
    float32 buffers once and reuses them for every chunk (``_FusedHeadLogprobs``); the budget bounds what
    they add to the pass's peak (2 x 32 MiB), and the one product block a chunk allocates where its product
    is oneDNN's (the chunk's logits themselves, in place of one buffer) or bf16 (copied into a buffer).
    """
    return max(32, min(HEAD_CHUNK_ROWS, HEAD_CHUNK_BYTES // (4 * max(1, vocab_size))))


def head_logprobs(model, hidden, completion_ids, completion_mask, *, temperature, with_entropy, chunk_size):
    """LM head + log-softmax over the real completion positions only, a chunk of rows at a time. A head made
    float32 by ``cast_lm_head_to_fp32`` gets float32 hidden states and runs outside autocast."""
    head = model.get_output_embeddings()
    fp32_head = getattr(head, FP32_HEAD, False)
    batch, num_completion, _ = hidden.shape
    keep = completion_mask.bool().flatten()  # [B*C]
    flat_idx = keep.nonzero().squeeze(1)  # [M]
    h = hidden.reshape(batch * num_completion, -1).index_select(0, flat_idx)  # [M, H]
    targets = completion_ids.reshape(-1).index_select(0, flat_idx).to(torch.long)  # [M]
    rows = chunk_size or head_chunk_rows(head.weight.shape[0])
    if fp32_head:
        h = h.to(head.weight.dtype)  # [M, H], float32 (the gradient flows back in the model's dtype)
    with torch.autocast(device_type=h.device.type, enabled=False) if fp32_head else nullcontext():
        logp, ent = _FusedHeadLogprobs.apply(
            h, head.weight, head.bias, targets, 1.0 / temperature, with_entropy, rows
        )
    out = hidden.new_zeros(batch * num_completion, dtype=torch.float32)
    logps = out.index_put((flat_idx,), logp).view(batch, num_completion)  # [B, C], 0 where masked
    entropy = out.index_put((flat_idx,), ent).view(batch, num_completion) if with_entropy else None
    return logps, entropy


class _FusedHeadLogprobs(torch.autograd.Function):
    """logp[m] = log softmax(z[m])[target[m]] and H[m] = -sum_v p log p, z = (h W^T + b) / temperature,
    without a [M, V] tensor: rows are processed ``rows`` at a time, and the backward recomputes each chunk's
    logits (one extra matmul) instead of keeping them. Each pass writes its chunks into [rows, V] float32
    buffers it allocates once (``_chunk_buffers``: two, or one beside oneDNN's own block of logits).

    Per row, with p = softmax(z):  dlogp/dz = 1[v = target] - p,   dH/dz = -p (log p + H).
    Math in float32 (the logits are upcast per chunk); the same quantities as
    ``grpokit.core.logprobs.logprobs_and_entropy`` applied to the full logits.

    Precision. The products run in one dtype: autocast's where autocast is on when the
    forward runs, else the weight's. The forward records it and casts h, W and b to it once per pass, as
    autocast casts ``F.linear``'s operands (not once per chunk: in inference mode and in the backward
    autocast keeps no cast, and would cast the [V, H] weight again for every chunk); the backward does the
    same wherever it is called from (a trainer calls it after leaving autocast), so it recomputes the
    forward's logits and its p = exp(z - lse) are the forward's probabilities. Its two gradient products
    take dL/dz rounded to that dtype, as autocast's ``F.linear`` backward does (each chunk's dL/dW product
    summed into a float32 gradient). Everything else (log-sum-exp, entropy, dL/dz, dL/db) is float32, with
    autocast off.
    """

    @staticmethod
    def forward(ctx, h, weight, bias, targets, inv_temperature, with_entropy, rows):
        ctx.set_materialize_grads(False)
        device = h.device.type
        ctx.product_dtype = autocast_dtype(weight.device) or weight.dtype
        num = h.shape[0]
        lse = torch.empty(num, dtype=torch.float32, device=h.device)
        logp = torch.empty(num, dtype=torch.float32, device=h.device)
        ent = torch.empty(num if with_entropy else 0, dtype=torch.float32, device=h.device)
        with torch.autocast(device, enabled=False), transient_blocks():  # (the chunks: freed by the end)
            hp, wp, bp = (cast(t, ctx.product_dtype) for t in (h, weight, bias))  # once per pass
            logits, exps = _chunk_buffers(num, rows, hp, wp, bp)  # [rows, V] each (logits: or None)
            for s in range(0, num, rows):
                m = min(rows, num - s)
                z = _chunk_logits(hp[s : s + rows], wp, bp, inv_temperature, _first(logits, m))  # [m, V] f32
                target = z.gather(1, targets[s : s + rows, None]).squeeze(1)  # [m]
                peak = z.amax(dim=1, keepdim=True)  # [m, 1]
                z.sub_(peak)  # z - max
                e = torch.exp(z, out=exps[:m])  # [m, V]
                total = e.sum(dim=1)  # [m]
                chunk_lse = peak.squeeze(1) + total.log()
                lse[s : s + rows] = chunk_lse
                logp[s : s + rows] = target - chunk_lse
                if with_entropy:
                    # H = lse - sum p z = log(total) - sum e (z - max) / total; e z in e's buffer (the
                    # same numbers as torch.linalg.vecdot(e, z), which makes a fresh [m, V] block for it)
                    ent[s : s + rows] = total.log() - e.mul_(z).sum(dim=1) / total
        ctx.save_for_backward(h, weight, bias, targets, lse, ent if with_entropy else None)
        ctx.inv_temperature, ctx.rows = inv_temperature, rows
        return logp, ent

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logp, grad_ent):
        h, weight, bias, targets, lse, ent = ctx.saved_tensors
        if ent is None:
            grad_ent = None
        if grad_logp is None and grad_ent is None:
            return (None,) * 7
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = None  # [V, H] float32: the chunks' dL/dW summed
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        rows, dtype = ctx.rows, ctx.product_dtype
        with torch.autocast(h.device.type, enabled=False):
            hp, wp, bp = (cast(t, dtype) for t in (h, weight, bias))  # the forward's operands
            logits, coefs = _chunk_buffers(h.shape[0], rows, hp, wp, bp)  # [rows, V] each (logits: or None)
            for s in range(0, h.shape[0], rows):
                sl = slice(s, s + rows)
                m = min(rows, h.shape[0] - s)
                z = _chunk_logits(hp[sl], wp, bp, ctx.inv_temperature, _first(logits, m))  # the forward's
                z.sub_(lse[sl, None])  # log p
                if grad_ent is not None:
                    # dL/dz = -p * (g_lp + g_h (log p + H)) + g_lp 1[v = target]
                    coef = torch.add(z, ent[sl, None], out=coefs[:m]).mul_(grad_ent[sl, None])  # [m, V]
                    if grad_logp is not None:
                        coef.add_(grad_logp[sl, None])
                    g = z.exp_().mul_(coef).neg_()
                else:
                    g = z.exp_().mul_(grad_logp[sl, None].neg())  # -p * g_lp
                if grad_logp is not None:
                    g.scatter_add_(1, targets[sl, None], grad_logp[sl, None])
                if ctx.inv_temperature != 1.0:
                    g.mul_(ctx.inv_temperature)
                if grad_b is not None:
                    grad_b += g.sum(dim=0)
                g = _in_dtype(g, dtype, spare=coefs)  # [m, V], dL/dz in the products' dtype
                if grad_h is not None:
                    grad_h[sl] = matmul(g, wp)  # [m, H]
                if need_w:
                    grad_w = _add_weight_gradient(grad_w, g, hp[sl])  # [V, H]
        return (
            grad_h,
            _weight_gradient(grad_w, weight) if need_w else None,
            grad_b.to(bias.dtype) if grad_b is not None else None,
            None,
            None,
            None,
            None,
        )


def _chunk_buffers(
    num: int, rows: int, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The float32 [min(rows, num), V] buffers that a pass's chunks are written into, for the products of
    ``h`` [M, H] with ``weight`` [V, H] (and ``bias``) in their dtype: the logits' (None where oneDNN computes
    the product, ``_writes_own_block``: its result is a block of its own, used as it is) and a second one.
    Allocated once per pass, not once per chunk (a block this large is mapped fresh from the kernel at every
    allocation under ``cpu_memory_reuse_below`` where the pass's blocks do not come from the heap,
    ``grpokit.models.transient``, and glibc's above 32 MiB)."""
    shape = (min(rows, num), weight.shape[0])
    second = torch.empty(shape, dtype=torch.float32, device=weight.device)
    if _writes_own_block(h, weight, bias):
        return None, second
    return torch.empty(shape, dtype=torch.float32, device=weight.device), second


def _writes_own_block(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether a chunk's float32 logits are the block oneDNN's product returns (``_chunk_logits``): float32
    operands where ``onednn_float32`` holds."""
    return h.dtype == weight.dtype == torch.float32 and onednn_float32(h, weight, bias)


def _first(buffer: torch.Tensor | None, m: int) -> torch.Tensor | None:
    """The first ``m`` rows of a chunk buffer (None: none)."""
    return None if buffer is None else buffer[:m]


def _add_weight_gradient(total: torch.Tensor | None, g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``total + g^T h`` [V, H] in float32 (``total`` None: the first chunk's alone, with no zeros to add it
    to), g [m, V] and h [m, H] in the products' dtype. A float32 product runs through oneDNN where
    ``onednn_float32`` holds, ``WEIGHT_GRADIENT_ROWS`` rows of the sum at a time, each block's product then
    added (so the pass holds one block, not a second [V, H]); SmolLM2's [49,152 x 170] x [170 x 576] took
    31.5 ms that way (30 in one product) against 45 for MKL's ``addmm_`` into the sum, on a 2-core Zen 5
    EPYC. Else ``addmm_`` adds it in the product; any other dtype's is computed as ``@`` computes it and
    summed in float32."""
    if g.dtype != torch.float32:
        part = g.t() @ h  # [V, H] in the products' dtype
        return part.float() if total is None else total.add_(part)
    if not onednn_float32(g, h):
        return torch.mm(g.t(), h) if total is None else total.addmm_(g.t(), h)
    if total is None:
        return matmul(g.t(), h)  # [V, H]
    for start in range(0, total.shape[0], WEIGHT_GRADIENT_ROWS):
        rows = slice(start, start + WEIGHT_GRADIENT_ROWS)
        total[rows].add_(matmul(g[:, rows].t(), h))  # [<=4096, H]
    return total


def _weight_gradient(total: torch.Tensor | None, weight: torch.Tensor) -> torch.Tensor:
    """The summed dL/dW in the weight's dtype; zeros where no chunk ran (no completion token)."""
    if total is None:
        return torch.zeros_like(weight)
    return total.to(weight.dtype)


def _in_dtype(g: torch.Tensor, dtype: torch.dtype, spare: torch.Tensor) -> torch.Tensor:
    """``g`` (float32) in ``dtype``: itself where that is float32, else written into ``spare``'s bytes (a
    chunk buffer no longer needed) where it fits, so that no fresh block is allocated per chunk."""
    if g.dtype == dtype:
        return g
    if dtype.itemsize > spare.dtype.itemsize:
        return g.to(dtype)
    return spare.view(-1).view(dtype)[: g.numel()].view_as(g).copy_(g)


def _chunk_logits(h, weight, bias, inv_temperature, out):
    """z = (h W^T + b) * inv_temperature in float32 [m, V], from operands already in the products' dtype
    (autocast off). A float32 product runs through oneDNN where ``onednn_float32`` holds (2.6x MKL's rate on
    Zen 5, ``grpokit.models.cpu_linear``), its result used as it is (``out`` None: ``_chunk_buffers``); else
    into ``out`` itself (``F.linear``'s own ``mm``/``addmm``, the same numbers). Any other dtype's is
    computed as ``F.linear`` computes it, then upcast into ``out``."""
    float32 = h.dtype == weight.dtype == torch.float32
    if float32 and out is None:
        z = linear(h, weight, bias)  # oneDNN's block
    elif not float32:
        z = out.copy_(linear(h, weight, bias))
    elif bias is None:
        z = torch.mm(h, weight.t(), out=out)
    else:
        z = torch.addmm(bias, h, weight.t(), out=out)
    if inv_temperature != 1.0:
        z.mul_(inv_temperature)
    return z
