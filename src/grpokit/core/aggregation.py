"""Loss aggregations: per-token loss [N, T] and mask [N, T] -> scalar.

Gradient-accumulation rule (the trainer relies on it): every aggregation except ``dapo`` normalises by its
LOCAL micro-batch, so a trainer accumulating M micro-batches divides those losses by M. ``dapo`` divides by
the GLOBAL completion-token count ``num_items_in_batch`` (all micro-batches of the optimizer step, all
processes) and must not be divided again. Under DDP, which averages gradients over P processes, pass
num_items_in_batch / P (as TRL does).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def grpo_aggregation(per_token_loss: Tensor, mask: Tensor) -> Tensor:
    """The paper's (DeepSeekMath eq. 3): mean over each sequence's masked tokens, then mean over sequences.

    loss = 1/N sum_i ( sum_t m_it l_it / max(1, sum_t m_it) )
    """
    m = mask.to(per_token_loss.dtype)
    per_seq = (per_token_loss * m).sum(-1) / m.sum(-1).clamp(min=1.0)  # [N]
    return per_seq.mean()


def bnpo_aggregation(per_token_loss: Tensor, mask: Tensor) -> Tensor:
    """Token mean over the local batch: loss = sum_it m_it l_it / max(1, sum_it m_it)."""
    m = mask.to(per_token_loss.dtype)
    return (per_token_loss * m).sum() / m.sum().clamp(min=1.0)


def dr_grpo_aggregation(per_token_loss: Tensor, mask: Tensor, max_completion_length: int) -> Tensor:
    """Dr. GRPO (arXiv:2503.20783): loss = sum_it m_it l_it / (N * max_completion_length).

    The normaliser is a constant, so every token weighs the same whatever its completion's length.
    """
    m = mask.to(per_token_loss.dtype)
    return (per_token_loss * m).sum() / (per_token_loss.shape[0] * max_completion_length)


def dapo_aggregation(
    per_token_loss: Tensor, mask: Tensor, num_items_in_batch: int | float | Tensor | None = None
) -> Tensor:
    """DAPO (arXiv:2503.14476): loss = sum_it m_it l_it / num_items_in_batch.

    num_items_in_batch: completion tokens in the whole optimizer step (all micro-batches, all processes); None
    falls back to the local count sum_it m_it (then the result is local, like bnpo).
    """
    m = mask.to(per_token_loss.dtype)
    if num_items_in_batch is None:
        denom = m.sum()
    else:
        denom = torch.as_tensor(num_items_in_batch, dtype=per_token_loss.dtype, device=per_token_loss.device)
    return (per_token_loss * m).sum() / denom.clamp(min=1.0)


def luspo_aggregation(per_token_loss: Tensor, mask: Tensor) -> Tensor:
    """LUSPO (Length-Unbiased Sequence Policy Optimization, arXiv:2602.05261): sum over each sequence's
    masked tokens, then mean over sequences: loss = 1/N sum_i sum_t m_it l_it.

    With GSPO's sequence-level ratio (importance_sampling_level="sequence", one l_i per sequence) this is
    1/N sum_i |o_i| l_i: each sequence's loss scaled by its length.
    """
    m = mask.to(per_token_loss.dtype)
    return (per_token_loss * m).sum(-1).mean()


AggregationFn = Callable[[Tensor, Tensor, "int | None", "int | float | Tensor | None"], Tensor]

AGGREGATIONS: dict[str, AggregationFn] = {
    "grpo": lambda loss, m, max_len, n_items: grpo_aggregation(loss, m),
    "bnpo": lambda loss, m, max_len, n_items: bnpo_aggregation(loss, m),
    "dr_grpo": lambda loss, m, max_len, n_items: dr_grpo_aggregation(loss, m, max_len),
    "dapo": lambda loss, m, max_len, n_items: dapo_aggregation(loss, m, n_items),
    "luspo": lambda loss, m, max_len, n_items: luspo_aggregation(loss, m),
}
"""aggregation name -> fn(per_token_loss, mask, max_completion_length, num_items_in_batch) -> scalar."""

AGGREGATION_IS_GLOBAL: dict[str, bool] = {
    "grpo": False, "bnpo": False, "dr_grpo": False, "dapo": True, "luspo": False,
}  # fmt: skip
"""True where the aggregation already normalises by the whole optimizer step (see the module docstring)."""
