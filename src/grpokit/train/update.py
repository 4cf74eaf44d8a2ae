"""The policy update: mu epochs over one RolloutBatch in minibatches with gradient accumulation."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from grpokit.config import GRPOConfig
from grpokit.core import PolicyLoss, off_policy_sequence_mask, top_entropy_mask
from grpokit.models.moe import RouterLoss
from grpokit.models.recompute import recomputed_in_backward
from grpokit.models.routing_replay import ExpertRouting, RoutingUse
from grpokit.parallel.cpu_runtime import blocks_from_heap, trim_heap
from grpokit.parallel.fsdp import unwrap_tensor
from grpokit.rollout.records import RolloutBatch
from grpokit.train.batch import balanced_micro_batches, micro_batch_indices, token_budget_micro_batches
from grpokit.train.entropy_control import EntropyControl

__all__ = ["UpdateContext", "keeps_whole_groups", "optimizer_step", "run_update", "shuffled_rows"]


@dataclass
class UpdateContext:
    """What an update needs besides the batch: the loss, the model, and how to take an optimizer step."""

    loss: PolicyLoss  # hyperparameters fixed for the run
    policy: torch.nn.Module  # PolicyLogprobs, possibly wrapped (DDP, FSDP, a DeepSpeed engine)
    backward: Callable[[torch.Tensor], None]  # accelerator.backward, or the DeepSpeed engine's
    step: Callable[[float], torch.Tensor | None]  # clip to max_norm, optimizer + scheduler step, zero the
    # gradients; returns the pre-clip global gradient norm
    sum_across_processes: Callable[[torch.Tensor], torch.Tensor]
    num_processes: int
    generator: torch.Generator
    max_across_processes: Callable[[torch.Tensor], torch.Tensor] = lambda t: t  # a 0-dim tensor's largest
    # value over the processes (one process: itself)
    micro_batch: Callable[[bool], AbstractContextManager[Any]] = lambda last: nullcontext()  # around one
    # micro-batch's forward and backward, given whether it is the optimizer step's last: gradients are
    # synchronised there (DDP's no_sync before it, DeepSpeed's accumulation boundary at it)
    entropy: EntropyControl | None = None  # the entropy bonus's coefficient (None: made from the config)
    off_policy_sampler: bool = False  # the sampler is not pi_old (vLLM, a dtype copy, drawn ahead): the
    # off-policy mask compares pi_theta with the sampler's own log-probs
    router: RouterLoss | None = None  # a mixture-of-experts policy's load-balancing loss (models.moe)
    routing_replay: str | None = None  # an MoE policy's routing_replay ("off", "R2", "R3": how the update
    # routes, models.routing_replay); None: a dense policy
    routing: ExpertRouting | None = None  # that policy's routers (a backward's recomputation replays too)

    @classmethod
    def from_accelerator(
        cls,
        accelerator: Any,
        loss: PolicyLoss,
        placed: Any,
        generator: torch.Generator,
        *,
        entropy: EntropyControl | None = None,
        off_policy_sampler: bool = False,
        router: RouterLoss | None = None,
        routing_replay: str | None = None,
        routing: ExpertRouting | None = None,
    ) -> UpdateContext:
        """Backward, gradient clipping (the pre-clip global norm, a plain tensor also when the gradients
        are sharded), the optimizer and scheduler steps and cross-process sums through ``accelerator``;
        backward and step through the DeepSpeed engine when ``placed.zero`` (``parallel.zero.ZeroEngine``) is
        set. ``placed``: the ``parallel.distributed.PreparedPolicy``."""
        policy, optimizer, scheduler, zero = placed.policy, placed.optimizer, placed.scheduler, placed.zero
        if zero is None:
            backward = accelerator.backward
            step = optimizer_step(optimizer, scheduler, policy, accelerator.clip_grad_norm_)
        else:
            backward, step = zero.backward, zero.step_function(scheduler)
        return cls(
            loss=loss,
            policy=policy,
            backward=backward,
            micro_batch=placed.micro_batch,
            step=step,
            sum_across_processes=lambda t: accelerator.reduce(t.to(accelerator.device), "sum"),
            num_processes=accelerator.num_processes,
            generator=generator,
            max_across_processes=lambda t: accelerator.gather(t.reshape(1).to(accelerator.device)).max(),
            entropy=entropy,
            off_policy_sampler=off_policy_sampler,
            router=router,
            routing_replay=routing_replay,
            routing=routing,
        )


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    policy: torch.nn.Module,
    clip_grad_norm: Callable[..., Any] = torch.nn.utils.clip_grad_norm_,
) -> Callable[[float], torch.Tensor | None]:
    """``step(max_norm)``: clip the trainable gradients to ``max_norm`` (0: measure only), step the
    optimizer and the scheduler, zero the gradients; returns the pre-clip global norm. A NaN/inf norm (a
    non-finite loss or gradient) skips the optimizer and scheduler steps: the weights stay as they were."""

    def step(max_norm: float) -> torch.Tensor | None:
        params = [p for p in policy.parameters() if p.requires_grad]
        if max_norm and max_norm > 0:
            norm = unwrap_tensor(clip_grad_norm(params, max_norm))
        else:
            norm = unwrap_tensor(torch.nn.utils.clip_grad_norm_(params, float("inf")))
        if not torch.isfinite(torch.as_tensor(norm)):
            optimizer.zero_grad(set_to_none=True)
            return norm
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return norm

    return step


def run_update(batch: RolloutBatch, config: GRPOConfig, ctx: UpdateContext) -> dict[str, float]:
    """num_iterations epochs; each shuffles the rows into steps_per_generation optimizer steps of
    gradient_accumulation_steps micro-batches. Returns metrics averaged over the optimizer steps, and
    ``nonfinite_steps``: how many were skipped for a NaN/inf loss or gradient. A context without an
    entropy controller gets one from ``config`` here, kept for the next updates."""
    if ctx.entropy is None:
        ctx.entropy = EntropyControl.from_config(config)
    rows_per_optimizer_step = config.per_device_train_batch_size * config.gradient_accumulation_steps
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    ctx.policy.train()
    trim_heap()  # a CPU run: the pages the sampler and log-prob passes freed, handed back (cpu_runtime)
    for _epoch in range(config.num_iterations):
        order = shuffled_rows(len(batch), config, ctx.generator)
        for rows in order.split(rows_per_optimizer_step):
            step_metrics = _optimizer_step(batch.select(rows), config, ctx)
            for name, value in step_metrics.items():
                sums[name] += value
                counts[name] += 1
    # every metric is a mean over the optimizer steps, but nonfinite_steps counts them
    return {name: sums[name] / (1 if name == "nonfinite_steps" else counts[name]) for name in sums}


def _optimizer_step(batch: RolloutBatch, config: GRPOConfig, ctx: UpdateContext) -> dict[str, float]:
    """One optimizer step over ``batch`` (this process's rows), accumulating micro-batch gradients.

    Logs ``loss`` (what was minimised, summed over the micro-batches), ``policy_loss`` (the same without the
    entropy bonus: loss = policy_loss - entropy_coef * H) and, with a bonus, ``entropy_coef`` (after the
    adaptive update, as TRL)."""
    micro_batches = _micro_batches(batch, config, ctx)
    # dapo normalises by the completion tokens of the whole global batch. DDP averages gradients over
    # processes, so each process divides by (global tokens / num_processes) to get the global token mean.
    global_tokens = ctx.sum_across_processes(batch.completion_mask.sum().float())
    num_items = float(global_tokens) / ctx.num_processes
    divide_by_micro_batches = not ctx.loss.is_global
    bonus_on = ctx.entropy.enabled
    coef = ctx.entropy.applied() if bonus_on else 0.0  # fixed for the whole step (adaptive: last step's)
    metric_sums: dict[str, float] = defaultdict(float)
    entropy_totals = torch.zeros(2)  # [sum of H over the bonus's tokens, their count] of this process
    shares = MicroBatchShare.each(batch, micro_batches, config.micro_batch_tokens is not None)
    for index, (rows, part) in enumerate(zip(micro_batches, shares)):
        with ctx.micro_batch(index == len(micro_batches) - 1):  # gradients synchronised at the last
            loss, metrics = _micro_batch_loss(batch.select(rows), config, ctx, num_items, bonus_on)
            if divide_by_micro_batches:
                loss = part.of_rows(loss)
            metric_sums["policy_loss"] += float(loss.detach())  # micro-batch losses add up to the step's
            bonus = metrics.pop("entropy_bonus", None)  # mean entropy H, with its gradient
            totals = metrics.pop("entropy_totals", None)
            if bonus is not None:  # a per-micro-batch mean, whatever the loss type's normalisation (as TRL;
                # micro-batches filled by tokens: weighted by their share of the step's tokens)
                loss = loss - coef * part.of_tokens(bonus)
                entropy_totals += totals
            aux = metrics.pop("router_loss", None)  # MoE load-balancing loss, with its gradient
            if aux is not None:  # scaled for accumulation like the loss (TRL: / gradient_accumulation_steps)
                loss = loss + ctx.router.coefficient * part.of_rows(aux)
                metrics["aux_loss"] = aux.detach()
            routing = ctx.routing.in_backward() if ctx.routing is not None else nullcontext()
            with routing, blocks_from_heap():  # (a CPU run: the backward's blocks reused, not faulted)
                ctx.backward(loss)  # (gradient checkpointing recomputes with the routing just replayed)
        metric_sums["loss"] += float(loss.detach())
        for name, value in metrics.items():
            metric_sums[name] += part.of_rows(float(value))
    grad_norm = ctx.step(config.max_grad_norm)
    if grad_norm is not None:
        metric_sums["grad_norm"] = float(grad_norm)
    finite = math.isfinite(metric_sums["loss"]) and (grad_norm is None or math.isfinite(float(grad_norm)))
    metric_sums["nonfinite_steps"] = 0.0 if finite else 1.0  # skipped by ctx.step (see optimizer_step)
    if bonus_on:
        if ctx.entropy.adaptive:  # the step's token-mean entropy over every process's tokens
            total, count = ctx.sum_across_processes(entropy_totals).tolist()
            ctx.entropy.step_done(total / max(count, 1.0))
        metric_sums["entropy_coef"] = ctx.entropy.coef
    return dict(metric_sums)


def _micro_batches(batch: RolloutBatch, config: GRPOConfig, ctx: UpdateContext) -> list[torch.Tensor]:
    """The optimizer step's micro-batches (row indices into ``batch``): per_device_train_batch_size rows
    each (whole units dealt by tokens where ``_balances``, else consecutive rows), or, with
    ``micro_batch_tokens``, consecutive units (whole groups where micro-batches keep groups
    whole) filled up to that many real backbone tokens, as many on every process (the largest count any
    process needs: sharded weights are gathered once per forward on all of them)."""
    group = config.num_generations
    unit = group if keeps_whole_groups(config) and len(batch) % group == 0 else 1
    if config.micro_batch_tokens is None:
        if _balances(batch, config, ctx, unit):
            tokens = batch.backbone_tokens(unit).tolist()  # [n / unit]
            return balanced_micro_batches(tokens, unit, config.per_device_train_batch_size // unit)
        return micro_batch_indices(len(batch), config.per_device_train_batch_size, shuffle=False)
    tokens = batch.backbone_tokens(unit).tolist()  # [n / unit]
    parts = token_budget_micro_batches(tokens, unit, config.micro_batch_tokens)
    count = int(ctx.max_across_processes(torch.tensor(len(parts))))
    if count == len(parts):
        return parts
    return token_budget_micro_batches(tokens, unit, config.micro_batch_tokens, count=count)


def _balances(batch: RolloutBatch, config: GRPOConfig, ctx: UpdateContext, unit: int) -> bool:
    """Whether the step's row micro-batches are dealt by tokens (``balance_micro_batches``): only where the
    step's gradient does not depend on which rows share a micro-batch (equal micro-batches of whole units;
    no loss term normalised over each micro-batch: bnpo, a top-entropy quantile, the entropy bonus, an MoE
    load-balancing loss), and there are two or more of them."""
    rows = config.per_device_train_batch_size
    return (
        config.balance_micro_batches
        and len(batch) > rows
        and len(batch) % rows == 0
        and rows % unit == 0
        and ctx.loss.aggregation != "bnpo"
        and config.top_entropy_quantile >= 1.0
        and not (ctx.entropy is not None and ctx.entropy.enabled)
        and ctx.router is None
    )


@dataclass(frozen=True)
class MicroBatchShare:
    """What one micro-batch's means weigh in its optimizer step.

    Micro-batches of equal rows (TRL's accumulation): each mean is divided by their ``count``. Micro-batches
    filled by a token budget (unequal): a mean over the micro-batch's rows (the loss of every aggregation
    but bnpo, the metrics) is weighted by its share of the step's rows, and a mean over its completion tokens
    (the entropy bonus) by its share of the step's completion tokens, so that the step's gradient equals one
    micro-batch holding every row."""

    count: int
    rows: float | None = None  # n_mb / n_step, or None: divide by count
    tokens: float | None = None  # completion tokens of the micro-batch / of the step, or None

    @classmethod
    def each(
        cls, batch: RolloutBatch, micro_batches: list[torch.Tensor], filled_by_tokens: bool
    ) -> list[MicroBatchShare]:
        """The share of each of ``micro_batches`` (row indices) in ``batch``, the optimizer step's rows
        (``filled_by_tokens``: by ``micro_batch_tokens``, of unequal sizes)."""
        count = len(micro_batches)
        if not filled_by_tokens:
            return [cls(count)] * count
        step_tokens = float(batch.completion_mask.sum())
        return [
            cls(
                count,
                rows=len(rows) / len(batch),
                tokens=float(batch.completion_mask[rows].sum()) / step_tokens if step_tokens else 0.0,
            )
            for rows in micro_batches
        ]

    def of_rows(self, value: Any) -> Any:
        """``value`` (a mean over the micro-batch's rows) weighted for the step."""
        return value / self.count if self.rows is None else value * self.rows

    def of_tokens(self, value: Any) -> Any:
        """``value`` (a mean over the micro-batch's completion tokens) weighted for the step."""
        return value / self.count if self.tokens is None else value * self.tokens


def keeps_whole_groups(config: GRPOConfig) -> bool:
    """Micro-batches hold whole groups of G rows when the micro-batch size is a multiple of G; then the
    group's shared prompt can be computed once (shared-prefix forward). Never with ragged groups (adaptive
    group sizes)."""
    if config.adaptive_num_generations:
        return False
    return config.per_device_train_batch_size % config.num_generations == 0


def shuffled_rows(num_rows: int, config: GRPOConfig, generator: torch.Generator) -> torch.Tensor:
    """A random order of the rows; whole groups move together when micro-batches hold whole groups."""
    group = config.num_generations
    if not keeps_whole_groups(config) or num_rows % group:
        return torch.randperm(num_rows, generator=generator)
    groups = torch.randperm(num_rows // group, generator=generator)  # [N/G]
    return (groups[:, None] * group + torch.arange(group)).reshape(-1)  # [N], each group contiguous


def _micro_batch_loss(
    batch: RolloutBatch, config: GRPOConfig, ctx: UpdateContext, num_items: float, bonus: bool
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The micro-batch's loss (no entropy bonus) and metrics; with ``bonus``, ``entropy_bonus`` (the mean
    entropy H over the tokens trained on, with its gradient) and ``entropy_totals`` ([sum of H, count])."""
    mask = batch.completion_mask.float()  # [n, C]
    routed: list[Any] | None = [] if ctx.router is not None else None  # receives an MoE's router logits
    routing = {}  # an MoE policy: the experts the update replays (R2, R3) or compares with (routing/update_*)
    if ctx.routing_replay is not None:
        use = RoutingUse.for_pass(ctx.routing_replay, "update", batch.routed_experts, batch.old_experts)
        routing["routing"] = use
    # lean_activations: the norms' and the packed attention's outputs made again in the backward, not kept
    with recomputed_in_backward() if config.lean_activations else nullcontext():
        logps, entropy = ctx.policy(  # PolicyLogprobs: completion_logprobs through the (DDP) module's forward
            batch.prompt_ids,
            batch.prompt_mask,
            batch.completion_ids,
            batch.completion_mask,
            temperature=config.temperature,
            with_entropy=True,
            num_generations=config.num_generations if keeps_whole_groups(config) else None,
            padding_free=config.padding_free,
            context_mask=batch.context_mask,
            router_logits=routed,
            **({} if batch.images is None else {"images": batch.images}),
            **routing,
        )
    token_weights = None  # [n, C] masks of the policy term (not of the KL), or None
    trained = mask  # [n, C] the tokens the entropy bonus acts on
    if config.top_entropy_quantile < 1.0:
        keep = top_entropy_mask(entropy.detach(), mask, config.top_entropy_quantile).float()  # [n, C]
        token_weights, trained = keep, mask * keep
    extra: dict[str, torch.Tensor] = {}
    if config.off_policy_mask_threshold is not None:
        keep_rows = _off_policy_mask(batch, logps, mask, config.off_policy_mask_threshold, ctx)  # [n, 1|C]
        keep_tokens = keep_rows.expand_as(mask)  # [n, C]
        token_weights = keep_tokens if token_weights is None else token_weights * keep_tokens
        dropped = ((1.0 - keep_tokens) * mask).sum() / mask.sum().clamp(min=1)
        extra["off_policy_mask/dropped_ratio"] = dropped
    _refuse_sequence_correction_with_vespo(batch, config)
    loss, metrics = ctx.loss(
        logps,
        batch.old_logps,
        batch.advantages,
        mask,
        ref_logps=batch.ref_logps,
        num_items_in_batch=num_items,
        token_weights=token_weights,
        sampler_weights=batch.importance_weights,  # [n, C] off-policy correction, or None (pi_old sampled)
    )
    metrics = {**metrics, **extra}
    metrics["entropy"] = (entropy.detach() * mask).sum() / mask.sum().clamp(min=1)
    if routed:  # the MoE backbone's router logits: its load-balancing loss (models.moe)
        metrics["router_loss"] = ctx.router(*routed[0])
    if bonus:  # H over the tokens the loss trains on, with its gradient
        metrics["entropy_bonus"] = (entropy * trained).sum() / trained.sum().clamp(min=1)
        metrics["entropy_totals"] = torch.stack([(entropy.detach() * trained).sum(), trained.sum()]).cpu()
    return loss, metrics


def _off_policy_mask(
    batch: RolloutBatch, logps: torch.Tensor, mask: torch.Tensor, threshold: float, ctx: UpdateContext
) -> torch.Tensor:
    """TRL's off-policy sequence mask, [n, 1] (or [n, C] with per-token advantages): pi_theta against the
    sampler's log-probs when the sampler is not pi_old, else against pi_old (on-policy at mu = 1: no drift,
    nothing dropped)."""
    sampled = batch.sampling_logps if ctx.off_policy_sampler else None
    reference = sampled if sampled is not None else batch.old_logps
    if reference is None:
        reference = logps.detach()  # [n, C] pi_old = pi_theta
    return off_policy_sequence_mask(batch.advantages, logps, reference, mask, threshold).float()


def _refuse_sequence_correction_with_vespo(batch: RolloutBatch, config: GRPOConfig) -> None:
    """VESPO folds per-token corrections into its sequence weight; a sequence-level one would be counted
    once per token (TRL refuses it for vLLM; here for any sampler that is not pi_old)."""
    if (
        config.loss_type == "vespo"
        and batch.importance_weights is not None
        and config.vllm_importance_sampling_mode.startswith("sequence")
    ):
        raise ValueError(
            "GRPOConfig.vllm_importance_sampling_mode must be 'token_truncate' or 'token_mask' with "
            f"loss_type='vespo' and an off-policy sampler, got {config.vllm_importance_sampling_mode!r}"
        )
