"""Several training processes: which device they use, and one set of logged metrics from all of them.

Each process generates, scores and updates on its own share of the prompts (whole groups); rewards are
gathered before the advantages (``GRPOTrainer.training_step``) and DDP averages the gradients, so the
optimisation is that of one big batch. What each process measures on its own share (completion lengths, the
loss, KL, clip ratios, process-reward statistics, failures) is merged here so the log describes the whole
batch, and every process ends the step with the same metrics.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import gather_object

__all__ = [
    "PreparedPolicy",
    "any_process",
    "decided_by_main",
    "end_processes",
    "gather_across_processes",
    "make_accelerator",
    "merge_process_metrics",
    "merged_across_processes",
    "needs_cpu_processes",
    "placement",
    "prepare_policy",
]


OWN_STRATEGIES = ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED")
"""``accelerate launch`` flags of the strategies grpokit applies itself."""


def _launched_processes() -> int:
    """Processes of this launch as torchrun / accelerate launch announce it (1 when run plainly)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def needs_cpu_processes() -> bool:
    """True for a multi-process launch (``WORLD_SIZE`` > 1) on a machine with no CUDA/XPU/MPS device:
    accelerate then only forms a process group (gloo) when told to use the CPU."""
    if _launched_processes() <= 1:
        return False
    accelerator_api = getattr(torch, "accelerator", None)  # torch >= 2.6
    if accelerator_api is not None:
        return not accelerator_api.is_available()
    return not torch.cuda.is_available()


def make_accelerator(mixed_precision: str, use_cpu: bool) -> Accelerator:
    """The run's ``Accelerator``: on the CPU when asked, or when processes share a CPU-only machine.

    accelerate keeps one process-wide state and refuses a second ``Accelerator`` with another precision.
    In a single process (a notebook training twice) that state is reset first, so a later trainer may use
    another ``mixed_precision``; under several processes accelerate's own error stands.
    """
    cpu = use_cpu or needs_cpu_processes()
    _forget_single_process_state(mixed_precision, cpu)
    # grpokit applies FSDP (parallel.fsdp) and DeepSpeed (parallel.zero) itself: accelerate's own wrapping
    # is kept out of the way.
    saved = {name: os.environ.pop(name) for name in OWN_STRATEGIES if name in os.environ}
    try:
        return Accelerator(mixed_precision=mixed_precision, cpu=cpu)
    finally:
        os.environ.update(saved)


def any_process(accelerator: Accelerator) -> Callable[[bool], bool]:
    """``agree(flag)``: True on every process when the flag is True on any (a max all-reduce)."""

    def agree(flag: bool) -> bool:
        if accelerator.num_processes == 1:
            return flag
        return bool(accelerator.reduce(torch.tensor(float(flag), device=accelerator.device), "max") > 0)

    return agree


def end_processes() -> None:
    """Leave the process group together at the end of a multi-process run: a process that exits with
    gloo's threads still alive can abort ("terminate called without an active exception") while another
    is still writing its files. Nothing happens in a single process."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def placement(args: Any, num_processes: int) -> str:
    """How the policy is placed over the processes: "fsdp" (``fsdp=full_shard`` or an FSDP launch), "zero"
    (DeepSpeed ZeRO: ``deepspeed`` or a DeepSpeed launch), else "ddp" (one process: plain)."""
    from grpokit.parallel.fsdp import fsdp_requested
    from grpokit.parallel.zero import zero_requested

    fsdp, zero = fsdp_requested(args, num_processes), zero_requested(args, num_processes)
    if fsdp and zero:
        raise ValueError("GRPOConfig.fsdp and deepspeed are both set: choose one way to shard")
    return "fsdp" if fsdp else "zero" if zero else "ddp"


@dataclass
class PreparedPolicy:
    """The policy as the update calls it, its optimizer and schedule, the DeepSpeed engine if any, and what
    generation and the no-grad log-prob passes read under the chosen placement."""

    policy: torch.nn.Module
    optimizer: Any
    scheduler: Any
    zero: Any = None  # parallel.zero.ZeroEngine under DeepSpeed ZeRO
    model: torch.nn.Module | None = None  # the bare model (moved or sharded in place)
    sharded: bool = False  # FSDP

    @property
    def scorer(self) -> torch.nn.Module:
        """What no-grad log-prob passes of the policy call: the model, or its sharded (partitioned) root."""
        if self.zero is not None:
            return self.zero.scorer
        return self.policy if self.sharded else self.model

    @property
    def generation_model(self) -> torch.nn.Module:
        """The model generation reads: the policy, or under ZeRO-3 its full copy refreshed before each
        generation."""
        return self.zero.generation_model if self.zero is not None else self.model

    def micro_batch(self, last: bool) -> AbstractContextManager[Any]:
        """The context of one micro-batch's forward and backward; ``last``: the optimizer step's last.
        DDP: gradients are all-reduced only at the last (``no_sync`` before: one all-reduce per optimizer
        step, not per micro-batch). DeepSpeed: the engine's accumulation boundary. FSDP: nothing (each
        micro-batch's gradients are reduce-scattered into the shards; skipping it would keep every unit's
        full gradients across micro-batches, the memory FSDP exists to save)."""
        if self.zero is not None:
            return self.zero.micro_batch(last)
        no_sync = getattr(self.policy, "no_sync", None)  # DDP (several processes)
        return nullcontext() if last or no_sync is None or self.sharded else no_sync()

    def generation_weights(self) -> Any:
        """A context with the full weights where generation reads them: FSDP gathers its units, ZeRO-3
        refreshes its generation copy."""
        if self.zero is not None:
            return self.zero.for_generation()
        from grpokit.parallel.fsdp import gathered

        return gathered(self.policy if self.sharded else None)


def prepare_policy(
    model: torch.nn.Module,
    runner: torch.nn.Module,
    args: Any,
    accelerator: Accelerator,
    reference: Any,
    total_optimizer_steps: int,
    strategy: str = "ddp",
    optimizers: tuple[Any, Any] = (None, None),
    find_unused_parameters: bool = False,
) -> PreparedPolicy:
    """``runner`` (the module whose forward is the training pass over ``model``, ``PolicyLogprobs``, so
    DDP, FSDP and DeepSpeed see that pass) placed under ``strategy``: "ddp" (accelerate: DDP under several
    processes), "fsdp" (``parallel.fsdp``; the reference sharded too) or "zero" (DeepSpeed ZeRO,
    ``parallel.zero``; at stage 3 the reference partitioned too); then the optimizer over its (possibly
    sharded) parameters. ``model`` stays the bare model (moved, or sharded, in place). ``optimizers`` (TRL's
    argument) only under "ddp": the other strategies build the optimizer over the parameters they place.
    ``find_unused_parameters``: DDP looks for trainable parameters a pass leaves without a gradient (a vision
    encoder's layers its model never reads, e.g. CLIP's post-layernorm in LLaVA), which it otherwise refuses;
    FSDP and DeepSpeed take such parameters as they are."""
    from grpokit.parallel.optim import build_optimizers

    if strategy == "ddp":
        optimizer, scheduler = build_optimizers(model, args, total_optimizer_steps, *optimizers)
        if find_unused_parameters:  # accelerate's DDP options (its kwargs_handlers), set before it wraps
            from accelerate.utils import DistributedDataParallelKwargs

            accelerator.ddp_handler = DistributedDataParallelKwargs(find_unused_parameters=True)
        prepared = accelerator.prepare(runner, optimizer, scheduler)
        if reference is not None:
            reference.to(accelerator.device)
        return PreparedPolicy(*prepared, model=model)
    if any(part is not None for part in optimizers):
        raise ValueError(f"optimizers: not supported with {strategy} (grpokit builds the optimizer)")
    if strategy == "zero":
        from grpokit.parallel.zero import ZeroEngine

        optimizer, scheduler = build_optimizers(model, args, total_optimizer_steps)
        zero = ZeroEngine(runner.to(accelerator.device), model, optimizer, args, accelerator.autocast)
        if reference is not None:
            reference.to(accelerator.device)
            if zero.stage == 3:
                reference.partition(args, zero.engine.module)
        return PreparedPolicy(zero.engine, zero.optimizer, scheduler, zero, model=model)
    from grpokit.parallel.fsdp import shard

    compute = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(accelerator.mixed_precision))
    policy = shard(runner, model, compute)
    if reference is not None:
        reference.shard(accelerator.device, policy, compute)
    optimizer, scheduler = build_optimizers(model, args, total_optimizer_steps)
    optimizer, scheduler = accelerator.prepare(optimizer, scheduler)
    return PreparedPolicy(policy, optimizer, scheduler, model=model, sharded=True)


def _forget_single_process_state(mixed_precision: str, cpu: bool) -> None:
    state = AcceleratorState._shared_state  # accelerate's singleton storage (empty before the first use)
    if not state or _launched_processes() > 1:
        return
    current = AcceleratorState()
    changed_device = cpu and current.device.type != "cpu"
    if str(current.mixed_precision) != mixed_precision or changed_device:
        AcceleratorState._reset_state(reset_partial_state=changed_device)


def _merge_one(name: str, values: list[float]) -> float:
    """How one metric combines over processes (each holds the same number of completions)."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return math.nan
    leaf = name.rsplit("/", 1)[-1]
    if leaf == "failures" or name == "tokens_per_second":
        return float(sum(finite))  # counts and throughputs add up
    if leaf.startswith("min"):
        return float(min(finite))
    if leaf.startswith("max") or name.startswith("time/"):
        return float(max(finite))  # the slowest process sets the pace
    return float(sum(finite) / len(finite))


def merge_process_metrics(per_process: Sequence[dict[str, float]]) -> dict[str, float]:
    """One metrics dict from each process's (keys in first-seen order).

    ``.../failures`` and ``tokens_per_second``: sum. Names whose last part starts with ``min`` / ``max``:
    min / max. ``time/...``: max. Everything else: the mean over processes, ignoring NaN. Per-completion
    means are then exact (every process holds the same number of completions); per-token and per-step
    means (loss, KL, entropy, process rewards) weight each process equally, as TRL's logging does.
    Metrics already computed on gathered data (rewards, advantages) are equal on every process and stay so.
    """
    names: dict[str, None] = {}
    for metrics in per_process:
        names.update(dict.fromkeys(metrics))
    return {name: _merge_one(name, [float(m[name]) for m in per_process if name in m]) for name in names}


def gather_across_processes(accelerator: Accelerator) -> Callable[[list[Any]], list[Any]] | None:
    """A function that concatenates a list from every process in process order (``gather_object``), or
    None when there is one process (then nothing needs gathering)."""
    return gather_object if accelerator.num_processes > 1 else None


def merged_across_processes(accelerator: Accelerator, metrics: dict[str, float]) -> dict[str, float]:
    """``metrics`` describing the whole batch, the same on every process (:func:`merge_process_metrics`)."""
    if accelerator.num_processes == 1:
        return metrics
    return merge_process_metrics(gather_object([metrics]))


def decided_by_main(accelerator: Accelerator, check: Callable[[], None]) -> None:
    """Run ``check`` on the main process only (one that reads or takes what all processes share, such as the
    output folder) and raise its ``InputError`` on every process, so that none waits at a collective for
    a process that stopped."""
    from grpokit.data.integrity import InputError

    message: list[Any] = [None]
    error: InputError | None = None
    if accelerator.is_main_process:
        try:
            check()
        except InputError as raised:
            error, message[0] = raised, (type(raised), str(raised))
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        message = broadcast_object_list(message, from_process=0)
    if error is not None:
        raise error
    if message[0] is not None:
        kind, text = message[0]
        raise kind(text)
