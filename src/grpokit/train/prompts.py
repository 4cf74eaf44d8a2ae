"""Which prompts each step trains on (a seeded shuffle per epoch and a position that checkpoints save), and
prompts as token ids."""

from __future__ import annotations

from typing import Any

import torch

from grpokit.chat import render_prompt
from grpokit.config import GRPOConfig

__all__ = ["PromptSampler", "encode_prompt"]


def encode_prompt(
    prompt: Any,
    tokenizer: Any,
    max_prompt_length: int | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of a prompt (chat template for message lists, without special tokens added twice), cut
    from the left to ``max_prompt_length``."""
    text = render_prompt(prompt, tokenizer, chat_template_kwargs)
    ids = tokenizer(text, add_special_tokens=isinstance(prompt, str))["input_ids"]
    return ids[-max_prompt_length:] if max_prompt_length is not None and len(ids) > max_prompt_length else ids


class PromptSampler:
    """Yields ``prompts_per_step`` row indices per step, epoch after epoch; every process sees the same
    global order and takes its own contiguous share."""

    def __init__(self, num_rows: int, prompts_per_step: int, args: GRPOConfig) -> None:
        self.num_rows = num_rows
        self.prompts_per_step = prompts_per_step
        self.shuffle = args.shuffle_dataset
        self.seed = args.seed
        self.epoch = 0
        self.position = 0
        self._order = self._epoch_order()

    def _epoch_order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_rows))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_rows, generator=generator).tolist()

    def next_indices(self) -> list[int]:
        """The global indices of the next step's prompts (wrapping into the next epoch as needed)."""
        indices: list[int] = []
        while len(indices) < self.prompts_per_step:
            if self.position == self.num_rows:
                self.epoch += 1
                self.position = 0
                self._order = self._epoch_order()
            take = min(self.prompts_per_step - len(indices), self.num_rows - self.position)
            indices += self._order[self.position : self.position + take]
            self.position += take
        return indices

    def next_local_rows(self, rows: list[dict[str, Any]], accelerator: Any) -> list[dict[str, Any]]:
        """This process's share of the next step's prompt rows."""
        indices = self.next_indices()
        share = len(indices) // accelerator.num_processes
        first = accelerator.process_index * share
        return [rows[i] for i in indices[first : first + share]]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._epoch_order()
