"""The reference policy pi_ref of the KL term (built only when beta > 0), its periodic reset or mix
(``sync_ref_model``), and its log-probs."""

from __future__ import annotations

import copy
from typing import Any

import torch

from grpokit.models.routing_replay import RoutingUse
from grpokit.rollout.records import RolloutBatch
from grpokit.train.batch import LogprobPass
from grpokit.train.forward import PolicyLogprobs

__all__ = ["Reference", "make_reference", "refuse_resets_of_adapter_reference", "sync_reference"]


def make_reference(policy: torch.nn.Module, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A frozen copy of ``policy`` in eval mode, its floating-point weights in ``dtype`` (None: the
    policy's own dtype, so a bf16 policy gets a bf16 reference)."""
    reference = copy.deepcopy(policy)
    if dtype is not None:
        reference.to(dtype)
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
        mix_into(ref_param, policy_params[name], alpha)
    copy_buffers(reference, policy)


@torch.no_grad()
def copy_buffers(reference: torch.nn.Module, policy: torch.nn.Module) -> None:
    """The policy's buffers (rotary tables, ...) into the reference's of the same name."""
    policy_buffers = dict(policy.named_buffers())
    for name, ref_buffer in reference.named_buffers():
        if name in policy_buffers:
            ref_buffer.copy_(policy_buffers[name])


@torch.no_grad()
def mix_into(ref_param: torch.Tensor, policy_param: torch.Tensor, alpha: float) -> None:
    """ref <- alpha * policy + (1 - alpha) * ref for one parameter, in the reference's dtype."""
    source = policy_param.detach().to(ref_param.dtype)
    if alpha == 1.0:
        ref_param.copy_(source)
    else:
        ref_param.mul_(1.0 - alpha).add_(source, alpha=alpha)


class Reference:
    """pi_ref: a frozen copy of the initial policy, or, when the policy is a PEFT model, the policy itself
    with its adapter disabled (the base weights are the reference; nothing is copied).

    ``model`` is the frozen copy (None for the adapter case), its weights in ``dtype`` (None: the policy's).
    With ``offload`` the copy lives on the CPU and visits the device only for its log-prob pass.
    """

    def __init__(
        self,
        policy: torch.nn.Module,
        *,
        adapter_disabled: bool = False,
        dtype: torch.dtype | None = None,
        offload: bool = False,
    ) -> None:
        self.policy = policy
        self.model = None if adapter_disabled else make_reference(policy, dtype)
        self.offload = offload and self.model is not None
        self.device: torch.device | None = None
        self.runner: torch.nn.Module | None = None  # what the log-prob pass calls (set when sharded)
        self.sharded_policy: torch.nn.Module | None = None
        self.zero3 = False  # partitioned by DeepSpeed ZeRO-3 (``partition``)

    def shard(
        self, device: torch.device, sharded_policy: torch.nn.Module, compute_dtype: torch.dtype | None = None
    ) -> None:
        """Under FSDP: shard the copy like the policy (``parallel.fsdp.shard``); the adapter case runs the
        sharded policy itself with its adapter disabled."""
        from grpokit.parallel.fsdp import shard

        if self.offload:
            raise ValueError(
                "GRPOConfig.ref_model_offload is not supported with fsdp: the sharded reference already "
                "holds 1/num_processes of the weights on each device"
            )
        self.device = torch.device(device)
        self.sharded_policy = sharded_policy
        if self.model is None:
            self.runner = sharded_policy
        else:
            self.runner = shard(PolicyLogprobs(self.model.to(device)), self.model, compute_dtype)

    def partition(self, args: Any, policy_runner: torch.nn.Module) -> None:
        """Under DeepSpeed ZeRO-3: partition the copy like the policy (an inference-only engine,
        ``parallel.zero.partitioned_runner``); the adapter case runs the partitioned policy itself."""
        from grpokit.parallel.zero import partitioned_runner

        if self.offload:
            raise ValueError("GRPOConfig.ref_model_offload is not supported with DeepSpeed ZeRO-3")
        self.zero3 = True
        if self.model is None:
            self.runner = policy_runner
        else:
            self.runner = partitioned_runner(PolicyLogprobs(self.model), self.model, args)

    @classmethod
    def for_run(cls, policy: torch.nn.Module, args: Any, *, adapter_disabled: bool) -> Reference | None:
        """The run's reference (None when ``beta`` is 0: no KL term, no reference), with
        ``ref_model_dtype`` ("auto": the policy's dtype) and ``ref_model_offload`` from the config."""
        if args.beta == 0:
            return None
        dtype = None if args.ref_model_dtype == "auto" else getattr(torch, args.ref_model_dtype)
        return cls(policy, adapter_disabled=adapter_disabled, dtype=dtype, offload=args.ref_model_offload)

    def to(self, device: torch.device | str) -> Reference:
        """Where the log-prob pass runs; an offloaded reference stays on the CPU until then."""
        self.device = torch.device(device)
        if self.model is not None and not self.offload:
            self.model.to(self.device)
        return self

    def logprobs(
        self, batch: RolloutBatch, logprob_pass: LogprobPass, routing: RoutingUse | None = None
    ) -> torch.Tensor:
        """log pi_ref of the batch's completions, [N, C], routed as ``routing`` says (an MoE policy)."""
        if self.model is None:
            with self.policy.disable_adapter():
                return logprob_pass(self.runner or self.policy, batch, routing)
        if not self.offload:
            return logprob_pass(self.runner or self.model, batch, routing)
        self.model.to(self.device)
        try:
            return logprob_pass(self.model, batch, routing)
        finally:
            self.model.to("cpu")

    def reset(self, alpha: float = 1.0) -> None:
        """ref <- alpha * policy + (1 - alpha) * ref (:func:`sync_reference`)."""
        if self.model is None:
            raise ValueError("the reference of a PEFT policy is its base model: it cannot be reset")
        if self.zero3:  # parameter by parameter: gather both, change the reference's on one process
            from grpokit.parallel.zero import gathered_params

            policy_params = dict(self.policy.named_parameters())
            for name, ref_param in self.model.named_parameters():
                source = policy_params[name]
                with gathered_params(ref_param, modifier_rank=0), gathered_params(source):
                    mix_into(ref_param, source, alpha)
            copy_buffers(self.model, self.policy)  # buffers are not partitioned
            return
        if self.runner is not None:  # sharded: a root keeps its weights gathered after a no-grad forward
            self.runner.reshard()
            self.sharded_policy.reshard()
        sync_reference(self.model, self.policy, alpha)  # shard by shard under FSDP

    def state_dict(self) -> dict[str, Any] | None:
        """The copy's weights (None when the reference is the adapter-disabled policy). Sharded: the full
        weights, gathered (a collective: every process calls it; the main one gets them)."""
        if self.model is None:
            return None
        if self.zero3:
            from grpokit.parallel.zero import gathered_state

            return gathered_state(self.model)
        if self.runner is not None:
            from grpokit.parallel.fsdp import full_state_dict

            return full_state_dict(self.runner)
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """The copy's weights from a checkpoint. Sharded or partitioned: only the main process's ``state``
        is read (a collective)."""
        if self.model is None or state is None:
            return
        main = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
        if self.zero3:  # partitioned: the main process's state, partitioned to every process
            from grpokit.parallel.zero import load_gathered_state

            load_gathered_state(self.model, state, is_main=main)
        elif self.runner is not None:  # sharded: the main process's state, sent to every shard
            from grpokit.parallel.fsdp import load_full_state_dict

            load_full_state_dict(self.runner, state if main else {}, from_main=True)
        else:
            self.model.load_state_dict(state)


def refuse_resets_of_adapter_reference(args: Any, peft_config: Any) -> None:
    """With PEFT the reference is the base model under the adapter: ``sync_ref_model`` and iterative GRPO's
    reset have nothing separate to reset, so they are refused up front."""
    for resets, name in ((args.sync_ref_model, "sync_ref_model"), (args.iteration_steps, "iteration_steps")):
        if peft_config is not None and resets:
            raise ValueError(
                f"GRPOConfig.{name} is not supported with peft_config: the reference is the "
                "base model with the adapter disabled, so there is nothing separate to reset"
            )
