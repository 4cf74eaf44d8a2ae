"""Memory-lean per-token log-probs and entropy from logits [B, T, V].

A float32 log-softmax of [B, T, V] logits is the largest tensor of a GRPO step (8 x 1024 x 152k floats is
5 GB). Here the logits are read in chunks of ``chunk_size`` positions, upcast to float32 one chunk at a time,
and a custom autograd function recomputes each chunk's softmax in the backward pass instead of keeping it,
so neither pass holds more than one float32 chunk (plus the [B, T] outputs and the logits' own gradient).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

CHUNK_BYTES = 16 * 2**20
"""Default float32 bytes per chunk: chunk_size = max(1, CHUNK_BYTES // (4 * V)) positions."""


LOG_P_FLOOR = -1e4
"""Floor for log p inside p * log p terms: a ruled-out token (logit -inf) gives 0 * -1e4 = 0, not NaN.
exp(-1e4) is exactly 0 in float32 and float64, so no finite term changes."""


def _default_chunk_size(vocab_size: int) -> int:
    return max(1, CHUNK_BYTES // (4 * max(1, vocab_size)))


def _chunks(batch: int, length: int, rows: int) -> Iterator[tuple[slice, slice]]:
    """(batch slice, time slice) views covering [B, T] with at most ``rows`` positions each; never copies."""
    if batch == 0 or length == 0:
        return
    if length <= rows:
        step = max(1, rows // length)  # whole sequences per chunk
        for b in range(0, batch, step):
            yield slice(b, b + step), slice(0, length)
    else:
        for b in range(batch):
            for t in range(0, length, rows):
                yield slice(b, b + 1), slice(t, t + rows)


def _scaled(chunk: Tensor, dtype: torch.dtype, inv_temperature: float) -> Tensor:
    z = chunk.to(dtype)  # [b, t, V]
    return z * inv_temperature if inv_temperature != 1.0 else z


class _LogProbsEntropy(torch.autograd.Function):
    """logp[b,t] = log_softmax(z[b,t])[index[b,t]] and H[b,t] = -sum_v p_v log p_v, z = logits / temperature.

    Backward, per chunk, with log p = log_softmax(z) recomputed (1/temperature applied at the end):
        dlogp/dz_v = 1[v = index] - p_v        dH/dz_v = -p_v (log p_v + H)
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        logits: Tensor,
        index: Tensor | None,
        inv_temperature: float,
        with_entropy: bool,
        chunk_size: int,
    ) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        batch, length, _ = logits.shape
        dtype = torch.promote_types(logits.dtype, torch.float32)  # float32 (float64 stays float64)
        logp = logits.new_empty((batch, length) if index is not None else (0,), dtype=dtype)  # [B, T]
        ent = logits.new_empty((batch, length) if with_entropy else (0,), dtype=dtype)  # [B, T]
        for bs, ts in _chunks(batch, length, chunk_size):
            log_p = torch.log_softmax(_scaled(logits[bs, ts], dtype, inv_temperature), dim=-1)  # [b, t, V]
            if index is not None:
                logp[bs, ts] = log_p.gather(-1, index[bs, ts].unsqueeze(-1)).squeeze(-1)
            if with_entropy:
                p = log_p.exp()
                ent[bs, ts] = -(p * log_p.clamp_(min=LOG_P_FLOOR)).sum(-1)
        ctx.save_for_backward(logits, index, ent if with_entropy else None)
        ctx.inv_temperature = inv_temperature
        ctx.chunk_size = chunk_size
        return logp, ent

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_logp: Tensor | None, grad_ent: Tensor | None) -> tuple:
        logits, index, ent = ctx.saved_tensors
        if index is None:
            grad_logp = None
        if ent is None:
            grad_ent = None
        if grad_logp is None and grad_ent is None:
            return None, None, None, None, None
        batch, length, _ = logits.shape
        dtype = torch.promote_types(logits.dtype, torch.float32)
        grad = torch.empty_like(logits)  # [B, T, V] in the logits' dtype
        for bs, ts in _chunks(batch, length, ctx.chunk_size):
            log_p = torch.log_softmax(
                _scaled(logits[bs, ts], dtype, ctx.inv_temperature), dim=-1
            )  # [b, t, V]
            p = log_p.exp()
            g_lp = grad_logp[bs, ts].unsqueeze(-1).to(dtype) if grad_logp is not None else None  # [b, t, 1]
            # dL/dz_v = g_lp (1[v = index] - p_v) - g_h p_v (log p_v + H) = -p_v coef_v + g_lp 1[v = index]
            if grad_ent is not None:
                g_h = grad_ent[bs, ts].unsqueeze(-1).to(dtype)  # [b, t, 1]
                coef = log_p.clamp_(min=LOG_P_FLOOR).add_(ent[bs, ts].unsqueeze(-1)).mul_(-g_h)  # [b, t, V]
                if g_lp is not None:
                    coef.sub_(g_lp)
                g = p.mul_(coef)  # [b, t, V], reusing p's memory
            else:
                g = p.mul_(-g_lp)
            if g_lp is not None:
                g.scatter_add_(-1, index[bs, ts].unsqueeze(-1), g_lp)
            if ctx.inv_temperature != 1.0:
                g.mul_(ctx.inv_temperature)
            grad[bs, ts] = g
        return grad, None, None, None, None


def _check_logits(logits: Tensor, temperature: float, chunk_size: int | None) -> int:
    if logits.dim() != 3:
        raise ValueError(f"logits must be 3-D [B, T, V], got shape {tuple(logits.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive number of positions, got {chunk_size}")
    return chunk_size if chunk_size is not None else _default_chunk_size(logits.shape[-1])


def logprobs_and_entropy(
    logits: Tensor,
    index: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of ``index`` and (optionally) entropy under softmax(logits / temperature).

    logits: [B, T, V] (any float dtype, e.g. bf16), index: [B, T] token ids. Returns (logps [B, T] float32,
    entropy [B, T] float32 or None). logps[b,t] = log softmax(logits[b,t] / temperature)[index[b,t]],
    entropy[b,t] = -sum_v p log p. Both are differentiable. chunk_size: positions per chunk (default: about
    16 MB of float32 per chunk).
    """
    rows = _check_logits(logits, temperature, chunk_size)
    if index.shape != logits.shape[:2]:
        raise ValueError(f"index must have shape [B, T]={list(logits.shape[:2])}, got {list(index.shape)}")
    index = index.to(device=logits.device, dtype=torch.long)
    logp, ent = _LogProbsEntropy.apply(logits, index, 1.0 / temperature, with_entropy, rows)
    return logp, (ent if with_entropy else None)


def selective_log_softmax(logits: Tensor, index: Tensor, chunk_size: int | None = None) -> Tensor:
    """log_softmax(logits, -1).gather(-1, index) without a float32 [B, T, V] tensor. logits [B, T, V],
    index [B, T] -> [B, T] float32; the gradient flows to logits."""
    return logprobs_and_entropy(logits, index, chunk_size=chunk_size)[0]


def entropy_from_logits(logits: Tensor, chunk_size: int | None = None) -> Tensor:
    """Entropy of softmax(logits) per position, H = -sum_v p_v log p_v: [B, T, V] -> [B, T] float32."""
    rows = _check_logits(logits, 1.0, chunk_size)
    _, ent = _LogProbsEntropy.apply(logits, None, 1.0, True, rows)
    return ent
