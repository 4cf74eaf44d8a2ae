"""Generation with ``transformers``' own ``model.generate`` (the reference backend), with the sampling
log-prob of every drawn token."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from grpokit.core import pad_left, trim_at_eos
from grpokit.models.routing_replay import routing_of, sampled_rows
from grpokit.models.vision import PromptImages, token_types
from grpokit.rollout.base import GenerationOutput, SamplingParams
from grpokit.rollout.logits import process_logits

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
        suppress_tokens=list(params.suppress_token_ids) or None,
        pad_token_id=params.pad_token_id,
        output_scores=True,  # the processed scores, read per step by _ChosenTokenLogprobs
        return_dict_in_generate=True,
        **sampling,
    )


class _ChosenTokenLogprobs(StoppingCriteria):
    """Reads, after each decode step, the log-probability of the token just drawn under the processed scores
    ``generate`` sampled from (``output_scores``: after repetition penalty, temperature, top-k, top-p, min-p),
    then empties that step's [B, V] scores: memory stays one step's scores, not max_new_tokens of them.
    Never stops generation."""

    def __init__(self) -> None:
        self.steps: list[torch.Tensor] = []  # one [B] float32 per decode step

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        step_scores = scores[-1]  # [B, V] float32, the processed scores of this step
        chosen = input_ids[:, -1:]  # [B, 1] the token drawn from them
        logp = step_scores.gather(1, chosen)[:, 0] - torch.logsumexp(step_scores, dim=-1)  # [B]
        self.steps.append(logp.float())
        step_scores.set_()  # frees its storage; generate does not read a step's scores again
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class TransformersBackend:
    """Samples with ``model.generate``: each prompt repeated G times, left-padded, one call per chunk.

    Reports the sampling log-prob of every drawn token: the log-softmax, at that token, of the processed
    scores ``generate`` drew it from (``output_scores=True``), so with top-k/top-p/min-p it is the log-prob
    under the truncated distribution, and with ``temperature`` under the tempered one, as the fast sampler
    reports. Greedy decoding (``do_sample=False``) reports the log-softmax of the scores after the repetition
    penalty only (no temperature or filters: ``generate`` applies none), which is the model's own log-prob of
    the chosen token, not 0 (its probability under the argmax), again as the fast sampler does.

    A ``generate`` that returns the token ids alone (a tensor, not a ``GenerateOutput``: a replaced or
    wrapped ``generate`` that ignores ``return_dict_in_generate`` and the stopping criteria) records no
    scores; the same log-probs then come from one forward pass over prompt + completion, each step's logits
    processed as ``generate`` processes them (``rollout.logits.process_logits``: repetition penalty over the
    prompt and the tokens drawn before, temperature, top-k, top-p, min-p).

    A vision-language model gets each row's image inputs (``images``: ``grpokit.models.vision``) with its
    prompt, and the per-token modality ids its architecture reads.
    """

    accepts_images = True
    """``generate`` takes ``images`` (the prompts' image inputs)."""

    def __init__(self, model: torch.nn.Module, *, micro_batch_size: int | None = None) -> None:
        self.model = model
        self.micro_batch_size = micro_batch_size

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        num_generations: int,
        params: SamplingParams,
        images: PromptImages | None = None,
    ) -> GenerationOutput:
        """``images``: the prompts' image inputs, one row per prompt of ``prompt_ids`` (or None)."""
        repeated = [list(ids) for ids in prompt_ids for _ in range(num_generations)]
        rows_images = None
        if images is not None:  # each prompt's images for its G rows
            rows_images = images[torch.arange(len(prompt_ids)).repeat_interleave(num_generations)]
        step = (self.micro_batch_size or len(prompt_ids)) * num_generations
        completions: list[list[int]] = []
        logprobs: list[list[float]] = []
        truncated: list[bool] = []
        routed: list[torch.Tensor] | None = []
        for start in range(0, len(repeated), step):
            chunk = None if rows_images is None else rows_images[start : start + step]
            rows, row_logprobs, flags, experts = self._generate_rows(
                repeated[start : start + step], params, chunk
            )
            completions += rows
            logprobs += row_logprobs
            truncated += flags
            routed = None if routed is None or experts is None else routed + experts
        return GenerationOutput(
            completion_ids=completions, logprobs=logprobs, truncated=truncated, routed_experts=routed
        )

    def _generate_rows(
        self, rows: list[list[int]], params: SamplingParams, images: PromptImages | None = None
    ) -> tuple[list[list[int]], list[list[float]], list[bool], list[torch.Tensor] | None]:
        """Completions, their log-probs and truncation flags, and (a mixture-of-experts model,
        ``grpokit.models.routing_replay``) the experts each fed token was routed to."""
        device = next(self.model.parameters()).device
        ids, mask = pad_left(rows, params.pad_token_id, device)  # [B, P]
        vision = {}
        if images is not None:  # pixel values and the architecture's extra tensors, per row
            vision = images.row_inputs(device)
            if images.token_type_key is not None:
                vision[images.token_type_key] = token_types(ids, self.model.config)
        recorder = _ChosenTokenLogprobs()
        routing = routing_of(self.model)  # an MoE model: the routers' choices, recorded
        was_training = self.model.training
        self.model.eval()
        try:
            with routing.recording() if routing is not None else nullcontext() as tape:
                out = self.model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    generation_config=generation_config(params),
                    stopping_criteria=StoppingCriteriaList([recorder]),
                    **vision,
                )
        finally:
            self.model.train(was_training)
        if isinstance(out, torch.Tensor):  # the ids alone: no scores were recorded
            if vision:
                raise TypeError("a generate that returns the ids alone is not supported with images")
            steps = _forward_logprobs(self.model, ids, mask, out, params).tolist()  # [B, steps]
            generated = out[:, ids.shape[1] :].tolist()  # [B, steps]
        else:
            generated = out.sequences[:, ids.shape[1] :].tolist()  # [B, steps]
            steps = torch.stack(recorder.steps, dim=1).tolist()  # [B, >= steps]
        pairs = [trim_at_eos(tokens, params.eos_token_ids) for tokens in generated]
        row_logprobs = [lp[: len(tokens)] for (tokens, _), lp in zip(pairs, steps)]
        experts = None
        if (
            tape is not None
        ):  # prefill [B, P] then one [B, 1] call per step; each row's real prompt on the left
            lengths = [int(n) for n in mask.sum(dim=1)]
            experts = sampled_rows(
                tape, lengths, ids.shape[1], 1, [len(t) for t, _ in pairs], routing.num_experts
            )
        return [tokens for tokens, _ in pairs], row_logprobs, [flag for _, flag in pairs], experts


def _forward_logprobs(
    model: torch.nn.Module,
    ids: torch.Tensor,
    mask: torch.Tensor,
    sequences: torch.Tensor,
    params: SamplingParams,
) -> torch.Tensor:
    """The sampling log-prob of each generated token of ``sequences`` [B, P + S] (prompts ``ids`` [B, P]
    left-padded, ``mask`` [B, P]): one forward over the whole sequences (positions counting real tokens
    only, as ``generate`` numbers them), then per step the processed scores ``generate`` would have drawn
    from (``process_logits``, with the prompt's real tokens and the tokens drawn so far as ``seen``) and
    the log-softmax at the drawn token. Returns [B, S] float32 (tokens after an EOS are scored too; the
    caller trims them)."""
    prompt_len, steps = ids.shape[1], sequences.shape[1] - ids.shape[1]
    if steps <= 0:
        return torch.zeros(ids.shape[0], 0)
    sequences = sequences.to(ids.device)
    full_mask = torch.cat([mask, torch.ones_like(sequences[:, prompt_len:])], dim=1)  # [B, P + S]
    positions = (full_mask.cumsum(dim=1) - 1).clamp(min=0)  # [B, P + S]
    logits = model(input_ids=sequences, attention_mask=full_mask, position_ids=positions).logits
    logits = logits[:, prompt_len - 1 : -1].float()  # [B, S, V]: the scores of each generated token
    vocab = logits.shape[-1]
    seen = torch.zeros(ids.shape[0], vocab, dtype=torch.long, device=ids.device)
    seen = seen.scatter_add_(1, ids.clamp(max=vocab - 1), mask.long()) > 0  # [B, V] the prompts' real tokens
    out = []
    for step in range(steps):
        scores = process_logits(logits[:, step], params, seen)  # [B, V]
        chosen = sequences[:, prompt_len + step].unsqueeze(1)  # [B, 1]
        out.append(scores.gather(1, chosen)[:, 0] - torch.logsumexp(scores, dim=-1))  # [B]
        seen = seen.scatter(1, chosen, True)
    return torch.stack(out, dim=1)  # [B, S]
