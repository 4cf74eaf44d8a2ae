"""Samples that do not come from the trainer's pi_old, and the correction for them (docs/generation.md).

The in-process samplers read the live policy: their samples are exactly pi_old's, and nothing here runs.
Two things make the sampler differ from pi_old:

- ``use_vllm``: vLLM generates, colocated or as a server (``grpokit.rollout.vllm_backend``), from the
  policy's weights pushed into it; its kernels and dtype are not the trainer's, and it reports the
  log-probs of the tokens it drew;
- ``generation_dtype`` other than the policy's: generation reads a copy of the policy in that dtype,
  refreshed from the policy before every ``generate`` call (:class:`CopiedWeightsBackend`); a bfloat16
  sampler for an fp32 run, as vLLM would be;
- a ``rollout_backend`` given to the trainer (an outside engine) that reports sampling log-probs.

Otherwise the sampler is pi_old, and where its log-probs are pi_old's to float rounding (float32 weights, no
mixed precision, plain sampling at the run's temperature) they stand in for the old-policy pass when the
update needs pi_old (:class:`SamplerLogprobs`, ``reuse_sampler_logprobs``).

Then, with ``vllm_importance_sampling_correction`` (TRL's name, default True), the trainer computes pi_old's
log-probs even when num_iterations is 1, and the policy term of every token is weighted by the importance
ratio pi_old / pi_sampler, truncated or masked per ``vllm_importance_sampling_mode``
(``core.token_weights.importance_sampling_ratio``), as TRL does for vLLM (:class:`OffPolicyCorrection`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from grpokit.core.token_weights import importance_sampling_ratio, importance_sampling_weights
from grpokit.rollout import GenerationOutput, RolloutBackend, SamplingParams, make_backend
from grpokit.rollout.records import RolloutBatch

__all__ = [
    "CopiedWeightsBackend",
    "OffPolicyCorrection",
    "SamplerLogprobs",
    "WeightSync",
    "copy_dtype",
    "correction_metrics",
    "generation_copy",
    "make_sampler",
    "policy_dtype",
    "refresh_copy",
    "sampler_copy",
]

logger = logging.getLogger(__name__)


def policy_dtype(model: nn.Module) -> torch.dtype:
    """The dtype holding most of ``model``'s floating-point parameter elements (a bf16 base with fp32 LoRA
    adapters is bf16)."""
    counts: Counter[torch.dtype] = Counter()
    for param in model.parameters():
        if param.is_floating_point():
            counts[param.dtype] += param.numel()
    return counts.most_common(1)[0][0] if counts else torch.float32


def copy_dtype(args: Any, model: nn.Module) -> torch.dtype | None:
    """The dtype of the sampler's copy of ``model`` (``generation_dtype``), or None when the sampler reads the
    policy itself (auto, or the policy's own dtype)."""
    dtype = None if args.generation_dtype == "auto" else getattr(torch, args.generation_dtype)
    return None if dtype is None or dtype == policy_dtype(model) else dtype


def sampler_copy(args: Any, model: nn.Module) -> nn.Module | None:
    """The ``generation_dtype`` copy of ``model`` where the sampler needs one (else None), for a policy about
    to be sharded (FSDP): made now, from the whole weights."""
    dtype = None if args.use_vllm else copy_dtype(args, model)
    return None if dtype is None else generation_copy(model, dtype)


def generation_copy(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A frozen copy of ``model`` with its floating-point parameters in ``dtype``, built without a full
    temporary copy in the policy's dtype. Buffers (rotary frequencies) keep their dtype, as
    ``from_pretrained(dtype=...)`` keeps them; tied weights stay tied."""
    memo: dict[int, Any] = {}
    for param in model.parameters():
        if id(param) not in memo:
            data = param.detach().to(dtype) if param.is_floating_point() else param.detach().clone()
            memo[id(param)] = nn.Parameter(data, requires_grad=False)
    copied = copy.deepcopy(model, memo)
    copied.requires_grad_(False)
    return copied.eval()


@torch.no_grad()
def refresh_copy(copied: nn.Module, model: nn.Module) -> None:
    """The copy's parameters and buffers <- ``model``'s, by name, cast to the copy's dtypes."""
    for kind in ("named_parameters", "named_buffers"):
        source = dict(getattr(model, kind)())
        for name, target in getattr(copied, kind)():
            target.copy_(source[name])


class CopiedWeightsBackend:
    """A ``RolloutBackend`` that generates with ``inner`` (built on ``copied``) after refreshing ``copied``
    from ``source``: the policy's current weights in another dtype, every call."""

    def __init__(self, source: nn.Module, copied: nn.Module, inner: RolloutBackend) -> None:
        self.source, self.copied, self.inner = source, copied, inner

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], num_generations: int, params: SamplingParams, **images: Any
    ) -> GenerationOutput:
        refresh_copy(self.copied, self.source)
        return self.inner.generate(prompt_ids, num_generations, params, **images)

    def __getattr__(self, name: str) -> Any:  # the inner backend's attributes (impl, last_stats, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def make_sampler(
    args: Any,
    model: nn.Module,
    rollout_backend: RolloutBackend | None,
    strategy: str,
    *,
    step_sync: bool = False,
    drawn_ahead: bool = False,
    copied: nn.Module | None = None,
) -> tuple[RolloutBackend, OffPolicyCorrection]:
    """The run's generation backend and its off-policy correction.

    ``rollout_backend`` (an outside sampler): used as is; off-policy. ``use_vllm``: vLLM over ``model``'s
    weights (``rollout.vllm_backend.make_vllm_backend``); off-policy; without vLLM or CUDA a
    ``VLLMUnavailableError`` (a RuntimeError) naming ``use_vllm=False`` stops the trainer here, before any
    step. Else ``generation_backend`` over ``model`` (the policy, pi_old itself: on-policy), or over its copy
    in ``generation_dtype`` when that differs from the policy's dtype (off-policy). ``strategy``: the
    placement (``parallel.distributed``); a dtype copy of FSDP-sharded weights is refused. ``step_sync``: the
    trainer pushes the weights into a vLLM backend itself at step boundaries (``sync_weights()``, within the
    full-weights context), instead of the backend pushing them at every ``generate`` call. ``drawn_ahead``:
    steps' samples are drawn ahead from older copies of the policy (``sampling.async_draw``), so they are
    off-policy whatever the sampler. ``copied``: the ``generation_dtype`` copy, made before the policy was
    sharded (``sampler_copy``): FSDP's weights cannot be copied once sharded; the copy is refreshed from the
    gathered weights before each generation."""
    if args.use_vllm:
        if rollout_backend is not None:
            raise ValueError(
                "GRPOTrainer(rollout_backend=...) and GRPOConfig.use_vllm=True both choose the sampler; "
                "pass one of them"
            )
        from grpokit.rollout.vllm_backend import make_vllm_backend

        backend = make_vllm_backend(args.vllm_settings(), model, step_sync=step_sync)
        return backend, OffPolicyCorrection.from_config(args, off_policy=True)
    if rollout_backend is not None:
        return rollout_backend, OffPolicyCorrection.from_config(args, off_policy=True)
    chosen = {
        "micro_batch_size": args.generation_micro_batch_size,
        "compile_decode": args.compile_decode,
        "padding_free": args.padding_free,
    }
    dtype = copy_dtype(args, model)
    if dtype is None:
        backend = make_backend(args.generation_backend, model, **chosen)
        return backend, OffPolicyCorrection.from_config(args, off_policy=drawn_ahead)
    if strategy == "fsdp" and copied is None:
        raise ValueError(
            f"GRPOConfig.generation_dtype={args.generation_dtype!r} with fsdp needs the copy made before the "
            "policy's weights are sharded (make_sampler(copied=sampler_copy(...)), as GRPOTrainer does)"
        )
    copied = generation_copy(model, dtype) if copied is None else copied
    inner = make_backend(args.generation_backend, copied, **chosen)
    return CopiedWeightsBackend(model, copied, inner), OffPolicyCorrection.from_config(args, off_policy=True)


class WeightSync:
    """Keeps a sampler that holds its own copy of the policy's weights (vLLM, colocated or a server) in step
    with the policy: one push per update, not one per ``generate`` call.

    The trainer calls ``release()`` once its samples are drawn (with vLLM's sleep mode the engine gives the
    update its memory) and ``push(timer)`` after the update, on every process and within ``full_weights()``
    (the trainer's full-weights context: FSDP units gathered, ZeRO-3's copy refreshed), timed as
    ``time/weight_push``; every later ``generate`` of the step, the evaluation and the next step's draw reuse
    the weights pushed. ``mark_changed()``: the weights changed outside a step (a resume), pushed at the next
    generation. A sampler that reads the live policy has no such methods, and the three calls do nothing.
    """

    def __init__(self, backend: Any, full_weights: Callable[[], contextlib.AbstractContextManager[Any]]):
        self.backend, self.full_weights = backend, full_weights
        self._push = getattr(backend, "sync_weights", None)

    def release(self) -> None:
        """The sampler's memory to the update (vLLM's sleep mode), until the next push."""
        release = getattr(self.backend, "release_memory", None)
        if callable(release):
            release()

    def push(self, timer: Any) -> None:
        """The policy's updated weights into the sampler, in ``timer``'s ``weight_push`` phase."""
        if callable(self._push):
            with timer.phase("weight_push"), self.full_weights():
                self._push()

    def mark_changed(self) -> None:
        """The policy's weights changed outside a step: the sampler pushes them before its next generation."""
        mark = getattr(self.backend, "mark_weights_changed", None)
        if callable(mark):
            mark()


class OffPolicyCorrection:
    """TRL's vLLM importance-sampling correction, for any sampler that is not pi_old.

    ``off_policy``: the sampler is not pi_old. ``active``: it is off-policy and
    ``vllm_importance_sampling_correction`` is on. It then applies
    to every batch whose sampler reported log-probs (``RolloutBatch.sampling_logps``); a backend that reports
    none gets no correction (logged once).
    """

    def __init__(
        self,
        active: bool,
        mode: str = "sequence_mask",
        clip_min: float | None = None,
        clip_max: float | None = 3.0,
        *,
        off_policy: bool | None = None,
    ) -> None:
        self.active, self.mode, self.clip_min, self.clip_max = active, mode, clip_min, clip_max
        self.off_policy = active if off_policy is None else off_policy
        """Whether the sampler is not pi_old (whether or not the correction is switched on)."""
        self._warned = False

    @classmethod
    def from_config(cls, args: Any, *, off_policy: bool) -> OffPolicyCorrection:
        """The correction of a GRPOConfig for a sampler that is (``off_policy``) or is not pi_old."""
        return cls(
            off_policy and args.vllm_importance_sampling_correction,
            args.vllm_importance_sampling_mode,
            args.vllm_importance_sampling_clip_min,
            args.vllm_importance_sampling_clip_max,
            off_policy=off_policy,
        )

    def applies(self, batch: RolloutBatch) -> bool:
        """Whether ``batch`` is corrected (then the trainer computes its pi_old log-probs, even at mu = 1)."""
        if self.active and batch.sampling_logps is None and not self._warned:
            self._warned = True
            logger.warning(
                "vllm_importance_sampling_correction: the sampler reports no log-probs, so its samples are "
                "trained on without the off-policy correction"
            )
        return self.active and batch.sampling_logps is not None

    def __call__(self, batch: RolloutBatch) -> dict[str, float]:
        """Set ``batch.importance_weights`` [N, C] (needs ``batch.old_logps``) and return the metrics; for a
        batch it does not apply to: nothing set, no metrics."""
        if not self.applies(batch):
            return {}
        if batch.old_logps is None:
            raise ValueError("the off-policy correction needs the batch's old_logps (pi_old)")
        mask = batch.completion_mask  # [N, C]
        bounds = {"mode": self.mode, "clip_min": self.clip_min, "clip_max": self.clip_max}
        batch.importance_weights = importance_sampling_weights(
            batch.old_logps, batch.sampling_logps, mask, **bounds
        )  # [N, C], 0 on padding
        ratio = importance_sampling_ratio(batch.old_logps, batch.sampling_logps, mask, **bounds)
        return correction_metrics(
            batch.old_logps, batch.sampling_logps, mask, ratio, sequence=self.mode.startswith("sequence")
        )


class SamplerLogprobs:
    """pi_old's log-probs taken from the sampler instead of the old-policy pass (``reuse_sampler_logprobs``).

    The in-process samplers report, for each drawn token, the log-softmax of the scores it was drawn from
    (``rollout.logits``, ``rollout.hf``). With plain sampling (temperature only) that is
    log softmax(logits / temperature) at the token, the quantity the old-policy pass computes
    (``train.forward.completion_logprobs``), from the same weights: equal up to float rounding, ~1e-6 in
    float32 (the decode's cached keys/values and fused projections sum in another order). Under bf16
    (autocast or weights) the two computations round apart by ~1e-2, so the pass runs there.

    ``backend`` is the sampler whose log-probs qualify (None: none does, ``reason`` says why); a batch's
    are used only when it came from that sampler and it reported them.
    """

    def __init__(self, backend: RolloutBackend | None, reason: str | None = None) -> None:
        self.backend, self.reason = backend, reason

    @classmethod
    def for_run(
        cls,
        args: Any,
        model: nn.Module,
        backend: RolloutBackend,
        correction: OffPolicyCorrection,
        *,
        environment: bool = False,
    ) -> SamplerLogprobs:
        """Whether the run's sampler (``make_sampler``'s ``backend`` and ``correction``) reports pi_old's
        log-probs: on ``model``'s own float32 weights, under no mixed precision, with plain sampling, and no
        ``environment`` (an episode's turns are sampled from contexts the batch does not hold token for
        token, and observation tokens have no log-probs). ``args``: the run's resolved config."""
        filters = {  # (a resolved config: generation_kwargs written into these fields)
            "top_k": args.top_k > 0,
            "top_p": args.top_p < 1.0,
            "min_p": args.min_p > 0.0,
            "repetition_penalty": args.repetition_penalty != 1.0,
        }
        dtype = policy_dtype(model)
        reasons = [
            (not args.reuse_sampler_logprobs, "reuse_sampler_logprobs=False"),
            (correction.off_policy, "the sampler is not pi_old (vLLM, generation_dtype, rollout_backend or "
                                    "async_generation)"),
            (args.mixed_precision != "no", f"mixed_precision={args.mixed_precision!r}"),
            (dtype not in (torch.float32, torch.float64), f"the policy's weights are {dtype}"),
            (any(filters.values()), "sampling with " + ", ".join(k for k, on in filters.items() if on)),
            (environment, "the run's episodes (an environment)"),
        ]  # fmt: skip
        reason = next((why for applies, why in reasons if applies), None)
        return cls(backend if reason is None else None, reason)

    def __call__(self, batch: RolloutBatch, backend: RolloutBackend) -> torch.Tensor | None:
        """log pi_old [N, C] of ``batch`` (0 off ``completion_mask``, as the pass leaves it) when it was
        sampled by the qualifying ``backend`` and carries its log-probs; else None."""
        if self.backend is None or backend is not self.backend or batch.sampling_logps is None:
            return None
        return torch.where(batch.completion_mask.bool(), batch.sampling_logps, 0.0)  # [N, C]

    def describe(self) -> str:
        """One line for the log at the start of a run that needs pi_old."""
        if self.backend is not None:
            return "reuse_sampler_logprobs: pi_old's log-probs come from the sampler (no old-policy pass)"
        return f"reuse_sampler_logprobs: the old-policy pass runs ({self.reason})"


@torch.no_grad()
def correction_metrics(
    old_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    ratio: torch.Tensor,
    *,
    sequence: bool,
) -> dict[str, float]:
    """TRL's metrics of the correction. old_logps, sampling_logps, mask: [N, C]; ratio: the truncated or
    masked ratio, [N, C] (token modes) or [N, 1] (``sequence`` modes).

    ``sampling/sampling_logp_difference/mean|max``: |log pi_old - log pi_sampler| over masked tokens whose
    sampler log-prob is known (not NaN). ``sampling/importance_sampling_ratio/min|mean|max``: the ratio
    applied, over masked tokens (token modes) or over sequences with at least one masked token (sequence
    modes). Empty selections give 0, as in TRL.
    """
    valid = mask.bool()  # [N, C]
    delta = (old_logps.float() - sampling_logps.float()).abs()  # [N, C]
    delta = delta[valid & ~torch.isnan(delta)]  # [M]
    applied = ratio[:, 0][valid.any(dim=-1)] if sequence else ratio[valid]  # [S] or [M]

    def stat(values: torch.Tensor, how: str) -> float:
        return float(getattr(values, how)()) if values.numel() else 0.0

    return {
        "sampling/sampling_logp_difference/mean": stat(delta, "mean"),
        "sampling/sampling_logp_difference/max": stat(delta, "max"),
        "sampling/importance_sampling_ratio/min": stat(applied, "min"),
        "sampling/importance_sampling_ratio/mean": stat(applied, "mean"),
        "sampling/importance_sampling_ratio/max": stat(applied, "max"),
    }
