"""Which prompts each step trains on (a seeded shuffle per epoch and a position that checkpoints save),
prompts as token ids (with their images for a vision-language policy: ``ImagePrompts``), and the up-front
length check of ``prompt_truncation="error"``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from grpokit.config import GRPOConfig
from grpokit.data.chat import render_prompt
from grpokit.data.integrity import InputError
from grpokit.models.vision import PromptImages, encode_row, encode_rows

if TYPE_CHECKING:
    from grpokit.sampling.prompt_stats import Curriculum

__all__ = ["ImagePrompts", "PromptSampler", "check_prompt_lengths"]


class ImagePrompts:
    """The prompts of a vision-language run as the policy reads them: the run's processor and prompt settings
    (``max_prompt_length``, ``chat_template_kwargs``, ``prompt_truncation``) over
    ``grpokit.models.vision.encode_row``."""

    def __init__(
        self,
        processor: Any,
        max_prompt_length: int | None,
        chat_template_kwargs: Any,
        truncation: str = "left",
    ) -> None:
        self.processor = processor
        self.max_prompt_length = max_prompt_length
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.truncation = truncation  # prompt_truncation: "left" cuts a text-only prompt, "error" refuses it

    def encode(
        self, rows: list[dict[str, Any]], sizes: list[int], where: str
    ) -> tuple[list[list[int]], PromptImages | None]:
        """(prompt ids [K], the prompts' ``PromptImages`` with ``sizes[k]`` rows each, or None)."""
        return encode_rows(self.processor, rows, sizes, where, **self._options())

    def encode_row(self, row: dict[str, Any], where: str) -> tuple[list[int], Any, str | None]:
        """One row: (its prompt's ids, its image tensors or None, the per-token modality key or None)."""
        return encode_row(self.processor, row, where, **self._options())

    def _options(self) -> dict[str, Any]:
        return {
            "max_prompt_length": self.max_prompt_length,
            "chat_template_kwargs": self.chat_template_kwargs,
            "truncation": self.truncation,
        }




def check_prompt_lengths(rows: list[dict[str, Any]], tokenizer: Any, args: GRPOConfig, *, name: str) -> None:
    """With ``args.prompt_truncation == "error"`` and a ``max_prompt_length``, refuse the first prompt
    longer than ``max_prompt_length`` tokens (ValueError naming ``name``, the row, its token count and the
    limit); otherwise do nothing (``"left"`` cuts long prompts in ``encode_prompt``).

    Tokens are counted as ``encode_prompt`` counts them: the chat template (with
    ``args.chat_template_kwargs``) for message lists, special tokens for plain strings. Rows are encoded
    in batches of ``_CHECK_BATCH`` texts, so a large data set costs a few batched tokenizer calls.
    """
    limit = args.max_prompt_length
    if args.prompt_truncation != "error" or limit is None:
        return
    for start in range(0, len(rows), _CHECK_BATCH):
        chunk = [row["prompt"] for row in rows[start : start + _CHECK_BATCH]]
        lengths = [0] * len(chunk)
        for standard in (True, False):  # plain strings get special tokens, rendered chats already have them
            indices = [i for i, prompt in enumerate(chunk) if isinstance(prompt, str) == standard]
            if indices:
                texts = [render_prompt(chunk[i], tokenizer, args.chat_template_kwargs) for i in indices]
                encoded = tokenizer(texts, add_special_tokens=standard)["input_ids"]
                for i, ids in zip(indices, encoded, strict=True):
                    lengths[i] = len(ids)
        for i, length in enumerate(lengths):
            if length > limit:
                raise InputError(
                    f"{name} row {start + i}: the prompt is {length} tokens, longer than "
                    f"max_prompt_length={limit} (prompt_truncation='error'; raise max_prompt_length, "
                    "shorten or drop the row, or set prompt_truncation='left' to keep its last tokens)"
                )


_CHECK_BATCH = 1024


class PromptSampler:
    """Yields ``prompts_per_step`` row indices per step, epoch after epoch; every process sees the same
    global order and takes its own contiguous share.

    With a ``curriculum`` (``sampling.prompt_stats.Curriculum``) the sampler walks the same epoch order but
    consumes each candidate as it goes and keeps only those the curriculum accepts, until the step has
    ``prompts_per_step``. So that a step always ends, after ``num_rows`` consecutive rejections (a full
    pass's worth) the next candidate is taken regardless (``Curriculum.note_forced`` counts it); the count of
    consecutive rejections carries over from step to step and is saved with the position.

    ``state_dict`` holds plain ints (it goes into ``trainer_state.json``); the curriculum's own state
    (statistics, generator) is saved by its owner (``Curriculum.state_dict``). Both restored, the sampler
    continues exactly where it stopped.
    """

    def __init__(
        self, num_rows: int, prompts_per_step: int, args: GRPOConfig, curriculum: Curriculum | None = None
    ) -> None:
        if curriculum is not None and curriculum.stats.num_rows != num_rows:
            raise ValueError(
                f"the curriculum tracks {curriculum.stats.num_rows} rows, the sampler draws from {num_rows}"
            )
        self.num_rows = num_rows
        self.prompts_per_step = prompts_per_step
        self.shuffle = args.shuffle_dataset
        self.seed = args.seed if args.data_seed is None else args.data_seed
        self.curriculum = curriculum
        self.epoch = 0
        self.position = 0
        self.rejections = 0  # consecutive candidates the curriculum refused
        self.last_indices: list[int] = []
        """The global indices the latest ``next_indices`` returned (the step's groups, in process order)."""
        self._order = self._epoch_order()

    def _epoch_order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_rows))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_rows, generator=generator).tolist()

    def _next_epoch_if_done(self) -> None:
        if self.position == self.num_rows:
            self.epoch += 1
            self.position = 0
            self._order = self._epoch_order()

    def next_indices(self, count: int | None = None) -> list[int]:
        """The global indices of the next ``count`` prompts (default: a step's), wrapping into the next epoch
        as needed, the same on every process."""
        wanted = self.prompts_per_step if count is None else count
        if self.num_rows == 0:
            raise ValueError("PromptSampler: there are no training rows to sample prompts from")
        indices: list[int] = []
        curriculum = self.curriculum
        while len(indices) < wanted:
            self._next_epoch_if_done()
            if curriculum is None:
                take = min(wanted - len(indices), self.num_rows - self.position)
                indices += self._order[self.position : self.position + take]
                self.position += take
                continue
            candidate = self._order[self.position]
            self.position += 1
            if self.rejections >= self.num_rows:
                curriculum.note_forced()
            elif not curriculum.accepts(candidate):
                self.rejections += 1
                continue
            self.rejections = 0
            indices.append(candidate)
        self.last_indices = indices
        return indices

    def next_local_indices(self, accelerator: Any, count: int | None = None) -> list[int]:
        """This process's contiguous share of the next ``count`` (default: a step's) global indices (process
        k takes the k-th ``count // num_processes``); ``last_indices`` holds them all."""
        indices = self.next_indices(count)
        share = len(indices) // accelerator.num_processes
        first = accelerator.process_index * share
        return indices[first : first + share]

    def next_local_rows(self, rows: list[dict[str, Any]], accelerator: Any) -> list[dict[str, Any]]:
        """This process's share of the next step's prompt rows."""
        return [rows[i] for i in self.next_local_indices(accelerator)]

    def state_dict(self) -> dict[str, int]:
        """Plain ints: the epoch, the position in its order and the consecutive rejections."""
        return {"epoch": self.epoch, "position": self.position, "rejections": self.rejections}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore ``state_dict`` (checkpoints from before the curriculum have no ``rejections``: 0)."""
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.rejections = int(state.get("rejections", 0))
        self._order = self._epoch_order()
