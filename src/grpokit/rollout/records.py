"""The records of one GRPO step, in the order they appear:

    Samples (what was generated, as token lists and text)
      -> Scores (rewards [N, F] and advantages [N] over every process's completions)
      -> RolloutBatch (padded tensors + the fixed log-probs: the one record the update reads)

N = prompts x G completions of the whole step, n = this process's share; groups are contiguous. The
functions between them are the step's (``grpokit.train.batch``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from grpokit.models.routing_replay import RoutedExperts
from grpokit.models.vision import PromptImages
from grpokit.rollout.base import GenerationOutput

__all__ = ["RolloutBatch", "Samples", "Scores"]


@dataclass
class Samples:
    """What one step sampled on this process: n = (its prompts) x G completions, groups contiguous."""

    rows: list[dict[str, Any]]
    """[n] the dataset rows, each repeated G times (reward functions read their columns)."""
    prompt_ids: list[list[int]]
    """[n/G] token ids of the distinct prompts."""
    generated: GenerationOutput
    """[n] completion ids, the sampler's log-probs, truncation flags."""
    texts: list[str]
    """[n] the decoded completions."""
    group_sizes: list[int] | None = None
    """Completions of each prompt (adaptive group sizes); None: every group has n / len(prompt_ids)."""
    episodes: list[Any] | None = None
    """[n] multi-turn episodes (``grpokit.envs.episodes.Episode``) when the run has an environment."""
    extra: dict[str, list[Any]] | None = None
    """Columns the reward functions logged with ``log_extra``: [n] values each (None: none)."""
    images: PromptImages | None = None
    """[n] rows: the image inputs of each row's prompt (a vision-language policy), or None."""

    def sizes(self) -> list[int]:
        """The size of every group, in order."""
        if self.group_sizes is not None:
            return list(self.group_sizes)
        return [len(self.texts) // len(self.prompt_ids)] * len(self.prompt_ids) if self.prompt_ids else []


@dataclass
class Scores:
    """One step's rewards and advantages over the whole batch: N rows, every process's in process order."""

    rewards: torch.Tensor
    """[N, F] one column per reward function; NaN where it returned None."""
    combined: torch.Tensor
    """[N] the weighted sum the advantages come from (NaN where no function applies)."""
    advantages: torch.Tensor
    """[N] group-relative outcome advantages."""
    failures: dict[str, float]
    """``rewards/<name>/failures``: failed values on this process (``reward_failure="none"``)."""
    local: slice
    """This process's rows within N."""
    group_sizes: list[int] | None = None
    """The groups' sizes over N (ragged with adaptive group sizes); None: all num_generations."""
    kept: torch.Tensor | None = None
    """[N] bool, with dynamic sampling: the rows the step trains on (the others' groups were dropped)."""


@dataclass
class RolloutBatch:
    """N = prompts x G completions of one step, groups contiguous. P = prompt width, C = completion width.

    Prompts are left-padded, completions right-padded; ``completion_mask`` is 0 on padding and on tokens
    excluded from the loss (truncated completions when ``mask_truncated_completions``, an episode's
    environment tokens: those stay in the context, ``context_mask``).
    """

    prompt_ids: torch.Tensor  # [N, P] long
    prompt_mask: torch.Tensor  # [N, P] long
    completion_ids: torch.Tensor  # [N, C] long
    completion_mask: torch.Tensor  # [N, C] long
    advantages: torch.Tensor  # [N] (outcome) or [N, C] (process supervision), float32
    old_logps: torch.Tensor | None = None  # [N, C] log pi_old, only when the update is off-policy
    ref_logps: torch.Tensor | None = None  # [N, C] log pi_ref, only when beta > 0
    sampling_logps: torch.Tensor | None = None  # [N, C] log-probs reported by the sampler, if any
    importance_weights: torch.Tensor | None = None  # [N, C] off-policy correction pi_old / pi_sampler
    # (sampling.off_policy), 0 on padding; None when the sampler is pi_old
    context_mask: torch.Tensor | None = None  # [N, C] long, episodes: 1 on every real completion token
    # (policy and environment's); completion_mask is 1 on the policy's only. None: equal to completion_mask
    images: PromptImages | None = None  # [N] rows: each row's prompt's image inputs (vision-language
    # policies, grpokit.models.vision); every forward over the batch gets them. None: text only
    routed_experts: RoutedExperts | None = None  # [N, P+C, L, k] the experts the sampler routed each token
    # to (a mixture-of-experts policy, grpokit.models.routing_replay); None: not recorded
    old_experts: RoutedExperts | None = None  # [N, P+C, L, k] the experts the old-policy pass used, where it
    # ran on a mixture-of-experts policy (routing_replay R2 replays them in the update)

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

    def backbone_tokens(self, group: int = 1) -> torch.Tensor:
        """[N / group] long: the real tokens the backbone runs for each unit of ``group`` consecutive rows
        (one group of G sharing a prompt, or one row): the unit's prompt once (with ``group`` > 1 the rows
        share it: the shared-prefix forward), plus every real completion token (an episode's environment
        tokens included). Padding is not counted."""
        rows = len(self)
        if rows % group:
            raise ValueError(f"{rows} rows do not split into units of {group}")
        context = self.completion_mask if self.context_mask is None else self.context_mask  # [N, C]
        prompt = self.prompt_mask.view(rows // group, group, -1)[:, 0].sum(-1)  # [N/group]
        completion = context.reshape(rows // group, -1).sum(-1)  # [N/group]
        return (prompt + completion).long()
