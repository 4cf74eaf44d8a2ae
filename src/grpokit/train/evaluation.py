"""The GRPO loss of evaluation samples (``eval_loss``): what the update would minimise on them, no gradient.

``trainer.evaluate()`` scores completions of held-out prompts (``eval/reward``). TRL and transformers also
report ``eval_loss``; here it is the training objective on the evaluated groups, with the policy as its own
pi_old (ratio 1), so it is ``-mean(A)`` aggregated as ``loss_type`` aggregates it, plus ``beta`` times the
k3 KL to the reference: ``A`` the group-relative advantages of the eval rewards (all zero for one greedy
completion per prompt, where the loss is the KL term alone).
"""

from __future__ import annotations

from typing import Any

import torch

from grpokit.core import PolicyLoss, multi_reward_advantages
from grpokit.rollout.records import Samples
from grpokit.train.batch import LogprobPass, pad_samples

__all__ = ["eval_advantages", "eval_loss"]


def eval_advantages(
    rewards: torch.Tensor, weights: torch.Tensor, sizes: list[int], config: Any
) -> torch.Tensor:
    """Group-relative advantages [N] of eval rewards [N, F] as the training step computes them; zeros for
    groups of one (greedy evaluation) and when no reward function scores completions (process rewards)."""
    if rewards.shape[1] == 0 or max(sizes) == 1:
        return torch.zeros(rewards.shape[0])
    return multi_reward_advantages(
        rewards, weights, group_sizes=sizes, scale=config.scale_rewards,
        aggregation=config.multi_objective_aggregation, eps=config.advantage_epsilon,
    )  # fmt: skip


def eval_loss(
    samples: Samples,
    advantages: torch.Tensor,
    *,
    loss: PolicyLoss,
    scorer: torch.nn.Module,
    reference: Any,
    temperature: float,
    micro_batch_size: int,
    padding: dict[str, Any],
) -> tuple[float, int]:
    """(the GRPO loss of ``samples`` under the policy ``scorer``, their completion tokens). ``reference``:
    the run's ``train.reference.Reference`` or None (beta 0); ``padding``: ``pad_samples``' keywords."""
    batch = pad_samples(samples, advantages, **padding)
    sizes = samples.group_sizes or [1] * len(samples.texts)
    group = sizes[0] if len(set(sizes)) == 1 and sizes[0] > 1 else None  # shared-prefix forward per group
    logprob_pass = LogprobPass(temperature, max(micro_batch_size, group or 1), group)
    logps = logprob_pass(scorer, batch)  # [n, C], no gradient
    ref_logps = reference.logprobs(batch, logprob_pass) if reference is not None else None
    mask = batch.completion_mask.float()  # [n, C]
    tokens = int(mask.sum())
    value, _ = loss(
        logps, None, batch.advantages, mask, ref_logps=ref_logps, num_items_in_batch=float(max(tokens, 1))
    )
    return float(value), tokens
