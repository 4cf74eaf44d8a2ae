"""The rollout protocol: every generation backend turns prompts into G completions each.

A backend is anything with a ``generate`` method of the shape below. Backends that run in the trainer's
process (``transformers`` ``generate``, the fast sampler) read the live policy weights, so there is nothing
to synchronise between an optimizer step and the next generation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from grpokit.models.loading import pad_token_id as tokenizer_pad_id

if TYPE_CHECKING:
    from grpokit.models.vision import PromptImages

__all__ = ["GenerationOutput", "RolloutBackend", "SamplingParams"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. Names and meanings follow ``transformers.GenerationConfig``."""

    max_new_tokens: int
    """Completion length limit in tokens (``max_completion_length``)."""
    temperature: float = 1.0
    """Softmax temperature; logits are divided by it."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability mass reaches ``top_p``."""
    top_k: int = 0
    """Keep only the ``top_k`` most likely tokens; 0 keeps all."""
    min_p: float = 0.0
    """Drop tokens whose probability is below ``min_p`` times the most likely token's; 0 disables."""
    repetition_penalty: float = 1.0
    """CTRL-style penalty on tokens already in prompt or completion (>1 discourages repeats)."""
    do_sample: bool = True
    """False: greedy decoding (evaluation)."""
    eos_token_ids: tuple[int, ...] = ()
    """Token ids that end a completion. The EOS token is kept as the last completion token."""
    pad_token_id: int = 0
    """Id used to pad prompts on the left for batched generation."""
    suppress_token_ids: tuple[int, ...] = ()
    """Token ids never drawn (their probability set to 0 before sampling): a vision-language policy's image
    and video placeholder tokens, which only the processor places."""

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, *, greedy: bool = False, **sampling: Any) -> SamplingParams:
        """``sampling`` (``max_new_tokens``, ``temperature``, ``top_p``, ...; ``GRPOConfig.sampling_params``
        gives a run's) with the tokenizer's EOS (ends a completion) and pad id
        (``grpokit.models.pad_token_id``: pad, else EOS, else 0). ``greedy``: argmax decoding (evaluation)."""
        eos = tokenizer.eos_token_id
        return cls(
            **sampling,
            do_sample=not greedy,
            eos_token_ids=(eos,) if eos is not None else (),
            pad_token_id=tokenizer_pad_id(tokenizer),
        )


@dataclass
class GenerationOutput:
    """Completions for P prompts x G samples, grouped contiguously: rows k*G .. k*G+G-1 belong to prompt k."""

    completion_ids: list[list[int]]
    """[P*G] token ids of each completion, unpadded; ends with an EOS id unless truncated."""
    logprobs: list[list[float]] | None = None
    """[P*G] log-probability of each sampled token under the sampling distribution (after temperature and
    filtering), or None when the backend does not report them."""
    truncated: list[bool] = field(default_factory=list)
    """[P*G] True when the completion hit ``max_new_tokens`` without an EOS token (an episode: cut by its
    turn or token limit before the environment ended it)."""
    policy_mask: list[list[int]] | None = None
    """[P*G] multi-turn episodes (``grpokit.envs.episodes``): 1 on each token the policy generated, 0 on
    the environment's observation tokens (context only: no loss, no KL). None: every token is the policy's."""
    routed_experts: list[Any] | None = None
    """[P*G] a mixture-of-experts sampler's routing (``grpokit.models.routing_replay``): row i's experts
    [p + c_i - 1, L, k] over its real prompt tokens and its completion tokens but the last (the tokens the
    sampler fed), or None when the sampler recorded none."""


@runtime_checkable
class RolloutBackend(Protocol):
    """Anything that samples ``num_generations`` completions for each prompt."""

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], num_generations: int, params: SamplingParams
    ) -> GenerationOutput:
        """prompt_ids: P distinct prompts (unpadded token ids). Returns P*num_generations completions."""
        ...


def generate_groups(
    backend: RolloutBackend,
    prompt_ids: Sequence[Sequence[int]],
    group_sizes: Sequence[int],
    params: SamplingParams,
    images: PromptImages | None = None,
) -> GenerationOutput:
    """``group_sizes[k]`` completions for prompt k through any backend, groups contiguous in prompt order.

    Equal sizes are one ``generate`` call. Ragged sizes take at most two: the prompts are split at the size
    threshold t that generates the fewest rows, those with ``size <= t`` sample t completions and the others
    the largest size, and each group keeps its first ``size`` completions. The completions of a prompt are
    independent draws, so the kept ones are exact samples; the rest (few: the threshold minimises them) are
    discarded. One call per distinct size would generate nothing extra, but a decode loop per size costs
    far more than the extra rows where per-step overhead dominates (small models, CPUs).
    ``images``: the prompts' image inputs (one row per prompt), for a backend that ``accepts_images``."""
    if len(prompt_ids) != len(group_sizes):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(group_sizes)} group sizes")

    def generate(indices: list[int], size: int) -> GenerationOutput:
        chosen = [prompt_ids[k] for k in indices]
        if images is None:
            return backend.generate(chosen, size, params)
        import torch

        return backend.generate(chosen, size, params, images=images[torch.tensor(indices)])

    largest = max(group_sizes)
    if min(group_sizes) == largest:
        return generate(list(range(len(prompt_ids))), largest)
    threshold = min(
        sorted(set(group_sizes))[:-1],
        key=lambda t: sum(t if g <= t else largest for g in group_sizes),
    )
    buckets = [(threshold, [k for k, g in enumerate(group_sizes) if g <= threshold]),
               (largest, [k for k, g in enumerate(group_sizes) if g > threshold])]  # fmt: skip
    groups: dict[int, tuple[list[list[int]], list[list[float]] | None, list[bool], list[Any] | None]] = {}
    for size, members in buckets:
        out = generate(members, size)
        flags = out.truncated or [False] * len(out.completion_ids)
        for j, k in enumerate(members):
            keep = slice(j * size, j * size + group_sizes[k])  # the first group_sizes[k] of its samples
            logprobs = None if out.logprobs is None else out.logprobs[keep]
            routed = None if out.routed_experts is None else out.routed_experts[keep]
            groups[k] = (out.completion_ids[keep], logprobs, flags[keep], routed)
    ordered = [groups[k] for k in range(len(prompt_ids))]
    logprobs = None if any(g[1] is None for g in ordered) else [lp for g in ordered for lp in g[1]]
    routed = None if any(g[3] is None for g in ordered) else [r for g in ordered for r in g[3]]
    return GenerationOutput(
        [ids for g in ordered for ids in g[0]], logprobs, [flag for g in ordered for flag in g[2]],
        routed_experts=routed,
    )  # fmt: skip
