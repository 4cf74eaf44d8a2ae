"""Token lists <-> padded tensors, and cutting a generated row at its EOS: the one home of both.

Prompts are padded on the left (so that every prompt ends where generation starts), completions and
classifier inputs on the right. Generation, the training batch, reward models, reward-model training and the
cold start all pad through here.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch
from torch import Tensor

__all__ = ["pad_left", "pad_right", "trim_at_eos"]


def pad_left(
    sequences: Sequence[Sequence[int]], pad_id: int, device: torch.device | str | None = None
) -> tuple[Tensor, Tensor]:
    """Stack token lists into ``(ids [B, L], mask [B, L])`` long tensors, padded on the left (L >= 1)."""
    return _pad(sequences, pad_id, device, left=True)


def pad_right(
    sequences: Sequence[Sequence[int]], pad_id: int, device: torch.device | str | None = None
) -> tuple[Tensor, Tensor]:
    """Stack token lists into ``(ids [B, L], mask [B, L])`` long tensors, padded on the right (L >= 1)."""
    return _pad(sequences, pad_id, device, left=False)


def _pad(
    sequences: Sequence[Sequence[int]], pad_id: int, device: torch.device | str | None, *, left: bool
) -> tuple[Tensor, Tensor]:
    width = max(1, max((len(seq) for seq in sequences), default=0))
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long, device=device)  # [B, L]
    mask = torch.zeros((len(sequences), width), dtype=torch.long, device=device)  # [B, L]
    for row, seq in enumerate(sequences):
        if len(seq):
            place = slice(width - len(seq), width) if left else slice(0, len(seq))
            ids[row, place] = torch.as_tensor(list(seq), dtype=torch.long, device=device)
            mask[row, place] = 1
    return ids, mask


def trim_at_eos(tokens: Sequence[int], eos_ids: Collection[int]) -> tuple[list[int], bool]:
    """Cut a generated row after its first EOS id (kept). Returns ``(tokens, truncated)``: truncated is True
    when no EOS occurs (then every position is a real token and the row is kept whole)."""
    for index, token in enumerate(tokens):
        if token in eos_ids:
            return list(tokens[: index + 1]), False
    return list(tokens), True
