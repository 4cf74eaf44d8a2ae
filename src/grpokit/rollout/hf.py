"""Generation with ``transformers``' own ``model.generate`` (the reference backend)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import GenerationConfig

from grpokit.rollout.base import GenerationOutput, SamplingParams


def left_pad(
    sequences: Sequence[Sequence[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack token lists into [B, L] ids and mask, padded on the left."""
    width = max(len(seq) for seq in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(sequences), width), dtype=torch.long, device=device)
    for row, seq in enumerate(sequences):
        if len(seq):
            ids[row, width - len(seq) :] = torch.as_tensor(list(seq), dtype=torch.long, device=device)
            mask[row, width - len(seq) :] = 1
    return ids, mask


def right_pad(
    sequences: Sequence[Sequence[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack token lists into [B, L] ids and mask, padded on the right (L >= 1)."""
    width = max(1, max(len(seq) for seq in sequences))
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(sequences), width), dtype=torch.long, device=device)
    for row, seq in enumerate(sequences):
        if len(seq):
            ids[row, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long, device=device)
            mask[row, : len(seq)] = 1
    return ids, mask


def trim_completion(tokens: list[int], eos_ids: tuple[int, ...]) -> tuple[list[int], bool]:
    """Cut a generated row after its first EOS (kept). Returns (tokens, truncated)."""
    for index, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[: index + 1], False
    return tokens, True  # no EOS: every generated position is a real token


def generation_config(params: SamplingParams) -> GenerationConfig:
    """A fresh GenerationConfig (the model's own generation defaults, such as top_k=50, do not leak in)."""
    sampling = {}
    if params.do_sample:
        sampling = {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k}
        if params.min_p > 0:
            sampling["min_p"] = params.min_p
    return GenerationConfig(
        max_new_tokens=params.max_new_tokens,
        do_sample=params.do_sample,
        repetition_penalty=params.repetition_penalty,
        eos_token_id=list(params.eos_token_ids) or None,
        pad_token_id=params.pad_token_id,
        **sampling,
    )


class TransformersBackend:
    """Samples with ``model.generate``: each prompt repeated G times, left-padded, one call per chunk."""

    def __init__(self, model: torch.nn.Module, *, micro_batch_size: int | None = None) -> None:
        self.model = model
        self.micro_batch_size = micro_batch_size

    @torch.inference_mode()
    def generate(
        self, prompt_ids: Sequence[Sequence[int]], num_generations: int, params: SamplingParams
    ) -> GenerationOutput:
        repeated = [list(ids) for ids in prompt_ids for _ in range(num_generations)]
        step = (self.micro_batch_size or len(prompt_ids)) * num_generations
        completions: list[list[int]] = []
        truncated: list[bool] = []
        for start in range(0, len(repeated), step):
            rows, flags = self._generate_rows(repeated[start : start + step], params)
            completions += rows
            truncated += flags
        return GenerationOutput(completion_ids=completions, logprobs=None, truncated=truncated)

    def _generate_rows(
        self, rows: list[list[int]], params: SamplingParams
    ) -> tuple[list[list[int]], list[bool]]:
        device = next(self.model.parameters()).device
        ids, mask = left_pad(rows, params.pad_token_id, device)
        was_training = self.model.training
        self.model.eval()
        try:
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, generation_config=generation_config(params)
            )
        finally:
            self.model.train(was_training)
        generated = out[:, ids.shape[1] :].tolist()
        pairs = [trim_completion(tokens, params.eos_token_ids) for tokens in generated]
        return [tokens for tokens, _ in pairs], [flag for _, flag in pairs]
