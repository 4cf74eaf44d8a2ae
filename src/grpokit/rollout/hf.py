"""Generation with ``transformers``' own ``model.generate`` (the reference backend)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import GenerationConfig

from grpokit.core import pad_left, trim_at_eos
from grpokit.rollout.base import GenerationOutput, SamplingParams

__all__ = ["TransformersBackend", "generation_config"]


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
        ids, mask = pad_left(rows, params.pad_token_id, device)
        was_training = self.model.training
        self.model.eval()
        try:
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, generation_config=generation_config(params)
            )
        finally:
            self.model.train(was_training)
        generated = out[:, ids.shape[1] :].tolist()
        pairs = [trim_at_eos(tokens, params.eos_token_ids) for tokens in generated]
        return [tokens for tokens, _ in pairs], [flag for _, flag in pairs]
