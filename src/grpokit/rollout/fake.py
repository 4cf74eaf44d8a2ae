"""An in-memory backend for tests and dry runs: completions come from a Python function, not a model."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from grpokit.rollout.base import GenerationOutput, SamplingParams

__all__ = ["ScriptedBackend"]


class ScriptedBackend:
    """``respond(prompt_text, sample_index) -> completion_text``; EOS is appended unless the text is cut at
    ``max_new_tokens`` (then it is flagged truncated), exactly like a real backend's output."""

    def __init__(self, tokenizer: Any, respond: Callable[[str, int], str]) -> None:
        self.tokenizer = tokenizer
        self.respond = respond

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], num_generations: int, params: SamplingParams
    ) -> GenerationOutput:
        completions: list[list[int]] = []
        truncated: list[bool] = []
        for ids in prompt_ids:
            prompt = self.tokenizer.decode(list(ids), skip_special_tokens=True)
            for index in range(num_generations):
                tokens = self.tokenizer(self.respond(prompt, index), add_special_tokens=False)["input_ids"]
                tokens = tokens + list(params.eos_token_ids[:1])
                cut = len(tokens) > params.max_new_tokens
                completions.append(tokens[: params.max_new_tokens])
                truncated.append(cut)
        return GenerationOutput(completion_ids=completions, logprobs=None, truncated=truncated)
