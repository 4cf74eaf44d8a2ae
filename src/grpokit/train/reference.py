"""The frozen reference policy pi_ref for the KL term, and its periodic reset/mix (sync_ref_model)."""

from __future__ import annotations

import copy

import torch


def make_reference(policy: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of ``policy`` in eval mode (built only when beta > 0)."""
    reference = copy.deepcopy(policy)
    reference.eval()
    reference.requires_grad_(False)
    return reference


@torch.no_grad()
def sync_reference(reference: torch.nn.Module, policy: torch.nn.Module, alpha: float = 1.0) -> None:
    """ref <- alpha * policy + (1 - alpha) * ref, parameter by parameter (alpha = 1: hard reset).

    Iterative GRPO and R1-Zero reset the reference to the current policy; TR-DPO style mixing uses alpha < 1.
    """
    policy_params = dict(policy.named_parameters())
    for name, ref_param in reference.named_parameters():
        source = policy_params[name].detach().to(ref_param.dtype)
        if alpha == 1.0:
            ref_param.copy_(source)
        else:
            ref_param.mul_(1.0 - alpha).add_(source, alpha=alpha)
    policy_buffers = dict(policy.named_buffers())
    for name, ref_buffer in reference.named_buffers():
        if name in policy_buffers:
            ref_buffer.copy_(policy_buffers[name])
