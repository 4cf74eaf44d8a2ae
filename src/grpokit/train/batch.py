"""RolloutBatch: the one record that travels from generation to the policy update."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


@dataclass
class RolloutBatch:
    """N = prompts x G completions of one step, groups contiguous. P = prompt width, C = completion width.

    Prompts are left-padded, completions right-padded; ``completion_mask`` is 0 on padding and on tokens
    excluded from the loss (for example truncated completions when ``mask_truncated_completions``).
    """

    prompt_ids: torch.Tensor  # [N, P] long
    prompt_mask: torch.Tensor  # [N, P] long
    completion_ids: torch.Tensor  # [N, C] long
    completion_mask: torch.Tensor  # [N, C] long
    advantages: torch.Tensor  # [N] (outcome) or [N, C] (process supervision), float32
    old_logps: torch.Tensor | None = None  # [N, C] log pi_old, only when num_iterations > 1
    ref_logps: torch.Tensor | None = None  # [N, C] log pi_ref, only when beta > 0
    sampling_logps: torch.Tensor | None = None  # [N, C] log-probs reported by the sampler, if any
    rewards: torch.Tensor | None = None  # [N] combined reward (NaN = none), for logging

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    def select(self, index: torch.Tensor | slice) -> RolloutBatch:
        """Rows ``index`` of every tensor field (None stays None)."""
        values = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            values[item.name] = None if value is None else value[index]
        return dataclasses.replace(self, **values)

    def num_completion_tokens(self) -> int:
        return int(self.completion_mask.sum())


def micro_batch_indices(
    num_rows: int, micro_batch_size: int, generator: torch.Generator | None = None, shuffle: bool = True
) -> list[torch.Tensor]:
    """Split row indices 0..num_rows-1 into consecutive micro-batches (shuffled first if ``shuffle``)."""
    order = torch.randperm(num_rows, generator=generator) if shuffle else torch.arange(num_rows)
    return list(order.split(micro_batch_size))
