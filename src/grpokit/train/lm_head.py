"""The chunked LM head of the training forward: per-token log-probs (and entropy) of the completion tokens
from the backbone's hidden states, without a [M, V] logits tensor (``grpokit.train.forward`` point 2)."""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch.autograd.function import once_differentiable

from grpokit.models.cpu_linear import linear, matmul, onednn_float32
from grpokit.models.parts import autocast_dtype, cast
from grpokit.models.policy import FP32_HEAD

__all__ = ["HEAD_CHUNK_BYTES", "HEAD_CHUNK_ROWS", "head_chunk_rows", "head_logprobs"]

HEAD_CHUNK_BYTES = 32 * 2**20
"""Float32 bytes of one chunk's logits [rows, V] (32 MiB): ``head_chunk_rows``' budget."""
HEAD_CHUNK_ROWS = 512
"""Most rows (completion positions) per LM-head chunk: the chunk's float32 logits are [rows, V]."""


def head_chunk_rows(vocab_size: int) -> int:
    """LM-head rows per chunk: as many as keep the chunk's float32 logits within ``HEAD_CHUNK_BYTES``, between
    32 and ``HEAD_CHUNK_ROWS`` (8,000 words: 512 rows; 49,152: 170; 152,064: 55).

    Each chunk's product reads the head's whole [V, H] weight, so the product runs at the matmul rate only
    with enough rows: SmolLM2-135M's [rows, 576] x [576, 49,152] ran at 117 GFLOP/s with 85 rows, 156 with
    170, 168 with 512 in MKL's product (a 2-core Zen 5 EPYC, where MKL's square products run at ~205;
    oneDNN's, which a float32 head uses there, ran at 411 with 170 rows). Each pass allocates its two
    [rows, V] float32 buffers once and reuses them for every chunk (``_FusedHeadLogprobs``); the budget
    bounds what they add to the pass's peak (2 x 32 MiB), and the one product block a chunk allocates
    where its product is oneDNN's or bf16 (copied into a buffer).
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
    logits (one extra matmul) instead of keeping them. Each pass writes its chunks into two [rows, V]
    float32 buffers it allocates once (``_chunk_buffers``).

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
        logits, exps = _chunk_buffers(num, rows, weight)  # [rows, V] each
        with torch.autocast(device, enabled=False):
            hp, wp, bp = (cast(t, ctx.product_dtype) for t in (h, weight, bias))  # once per pass
            for s in range(0, num, rows):
                m = min(rows, num - s)
                z = _chunk_logits(hp[s : s + rows], wp, bp, inv_temperature, logits[:m])  # [m, V] float32
                target = z.gather(1, targets[s : s + rows, None]).squeeze(1)  # [m]
                peak = z.amax(dim=1, keepdim=True)  # [m, 1]
                z.sub_(peak)  # z - max
                e = torch.exp(z, out=exps[:m])  # [m, V]
                total = e.sum(dim=1)  # [m]
                chunk_lse = peak.squeeze(1) + total.log()
                lse[s : s + rows] = chunk_lse
                logp[s : s + rows] = target - chunk_lse
                if with_entropy:
                    # H = lse - sum p z = log(total) - sum e (z - max) / total
                    ent[s : s + rows] = total.log() - torch.linalg.vecdot(e, z) / total
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
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        rows, dtype = ctx.rows, ctx.product_dtype
        logits, coefs = _chunk_buffers(h.shape[0], rows, weight)  # [rows, V] each
        with torch.autocast(h.device.type, enabled=False):
            hp, wp, bp = (cast(t, dtype) for t in (h, weight, bias))  # the forward's operands
            for s in range(0, h.shape[0], rows):
                sl = slice(s, s + rows)
                m = min(rows, h.shape[0] - s)
                z = _chunk_logits(hp[sl], wp, bp, ctx.inv_temperature, logits[:m])  # the forward's [m, V]
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
                if grad_w is not None and dtype == torch.float32:
                    grad_w.addmm_(g.t(), hp[sl])
                elif grad_w is not None:
                    grad_w += g.t() @ hp[sl]  # [V, H] in the products' dtype, summed in float32
        return (
            grad_h,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if grad_b is not None else None,
            None,
            None,
            None,
            None,
        )


def _chunk_buffers(num: int, rows: int, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two float32 [min(rows, num), V] buffers that a pass's chunks are written into: allocated once per pass,
    not once per chunk (a block this large is mapped fresh from the kernel at every allocation under
    ``cpu_memory_reuse_below``, and glibc's above 32 MiB)."""
    shape = (min(rows, num), weight.shape[0])
    return (
        torch.empty(shape, dtype=torch.float32, device=weight.device),
        torch.empty(shape, dtype=torch.float32, device=weight.device),
    )


def _in_dtype(g: torch.Tensor, dtype: torch.dtype, spare: torch.Tensor) -> torch.Tensor:
    """``g`` (float32) in ``dtype``: itself where that is float32, else written into ``spare``'s bytes (a
    chunk buffer no longer needed) where it fits, so that no fresh block is allocated per chunk."""
    if g.dtype == dtype:
        return g
    if dtype.itemsize > spare.dtype.itemsize:
        return g.to(dtype)
    return spare.view(-1).view(dtype)[: g.numel()].view_as(g).copy_(g)


def _chunk_logits(h, weight, bias, inv_temperature, out):
    """z = (h W^T + b) * inv_temperature in float32, written into ``out`` [m, V], from operands already in the
    products' dtype (autocast off). A float32 product runs through oneDNN where ``onednn_float32`` holds
    (2.6x MKL's rate on Zen 5, ``grpokit.models.cpu_linear``), else into ``out`` itself (``F.linear``'s own
    ``mm``/``addmm``, the same numbers); any other dtype's is computed as ``F.linear`` computes it; both
    then upcast into ``out``."""
    float32 = h.dtype == weight.dtype == torch.float32
    if not float32 or onednn_float32(h, weight, bias):
        z = out.copy_(linear(h, weight, bias))
    elif bias is None:
        z = torch.mm(h, weight.t(), out=out)
    else:
        z = torch.addmm(bias, h, weight.t(), out=out)
    if inv_temperature != 1.0:
        z.mul_(inv_temperature)
    return z
