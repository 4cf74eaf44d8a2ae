"""DeepSpeed ZeRO: AdamW's state (stage 1), the gradients (stage 2) and the weights (stage 3) partitioned
over the processes.

Requested by ``GRPOConfig.deepspeed`` (``"zero1"``/``"zero2"``, or as in TRL a DeepSpeed JSON file or
dict, whose ``zero_optimization`` section is used) or by ``accelerate launch`` with a DeepSpeed config
(``recipes/accelerate/deepspeed_zero2.yaml``: ``ACCELERATE_USE_DEEPSPEED``, ``ACCELERATE_DEEPSPEED_*``).

grpokit builds the engine itself (``deepspeed.initialize`` around ``PolicyLogprobs``, the module whose
forward is the lean log-prob pass), on CUDA and on CPU processes over gloo alike, with the run's own AdamW
and schedule; everything grpokit decides is set here, whatever the file says: the micro-batch, the number
of micro-batches per optimizer step, gradient clipping, and no DeepSpeed precision mode. Mixed precision is
accelerate's autocast, as without DeepSpeed: the engine's module runs its forward under the same autocast
as the trainer's other passes (accelerate adds it only to what ``prepare`` wraps, and the engine is not),
so the update, the old-policy and the reference passes compute in one precision (at learning rate 0 the
ratio is exactly 1) while the weights stay in their own dtype (float32 master weights, and
``save_pretrained`` writes them whole). fp16 is refused: it needs loss scaling, which the engine would do
only in its own fp16 mode. The update calls the engine's ``backward`` then ``step`` per micro-batch, as
DeepSpeed expects, with the accumulation boundary set explicitly (``set_gradient_accumulation_boundary``):
the optimizer steps at the last micro-batch of grpokit's optimizer step, also when a step holds fewer
micro-batches than ``gradient_accumulation_steps`` (ragged groups), so DeepSpeed's counter never drifts
from the schedule. ZeRO-2 reduces the gradients of each micro-batch into their partitions (its design; no
``no_sync``).

Stage 3: DeepSpeed gathers a module's weights around its forward and backward. The lean log-prob pass reads
the LM head's weight inside its fused chunked head rather than calling the module, so that weight is
registered as an external parameter of the ``PolicyLogprobs`` root (gathered for the root's forward and
backward). Generation reads weights directly too (the fast sampler's fused projections): it runs on a copy
of the policy whose tensors exist only during a generation call. Before each, the copy is filled one
parameter at a time from the partitioned weights (one parameter gathered at a time, never the whole model);
after it, the copy's storage is released (as TRL's ``unwrap_model_for_generation`` gathers the weights
for the generation call only; the plan counts the copy in the generation phase). The reference is a
second, inference-only engine (partitioned the same way, gathered module by module in its pass); its reset
and the checkpoints gather one parameter at a time too (``gathered_params``).
"""

from __future__ import annotations

import copy
import functools
import json
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "SHORTHANDS",
    "ZeroEngine",
    "deepspeed_config",
    "gathered_params",
    "gathered_state",
    "load_gathered_state",
    "partitioned_runner",
    "zero_requested",
    "zero_stage",
]

SHORTHANDS = {"zero1": 1, "zero2": 2, "zero3": 3}
"""``GRPOConfig.deepspeed`` values that name a ZeRO stage."""


def _launch_config() -> dict[str, Any] | None:
    """The DeepSpeed settings ``accelerate launch`` passed in the environment, or None."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true":
        return None
    file = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if file and file != "none":
        return json.loads(Path(file).read_text())
    zero: dict[str, Any] = {"stage": int(os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2"))}
    offload = os.environ.get("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "none")
    if offload != "none":
        zero["offload_optimizer"] = {"device": offload}
    return {"zero_optimization": zero}


def _user_config(args: Any) -> dict[str, Any] | None:
    spec = getattr(args, "deepspeed", None)
    if spec is None:
        return _launch_config()
    if isinstance(spec, dict):
        return dict(spec)
    if spec in SHORTHANDS:
        return {"zero_optimization": {"stage": SHORTHANDS[spec]}}
    path = Path(str(spec))
    if not path.is_file():
        raise ValueError(
            f"GRPOConfig.deepspeed: {spec!r} is neither {', '.join(SHORTHANDS)} nor a DeepSpeed JSON file"
        )
    return json.loads(path.read_text())


def zero_stage(args: Any) -> int:
    """The ZeRO stage this run asks for (0: none, or DeepSpeed without ZeRO)."""
    config = _user_config(args) or {}
    return int((config.get("zero_optimization") or {}).get("stage", 0))


def zero_requested(args: Any, num_processes: int) -> bool:
    """Whether this run uses DeepSpeed (``args.deepspeed`` or ``accelerate launch``); a single process is
    refused with a message."""
    if _user_config(args) is None:
        return False
    if num_processes == 1:
        raise ValueError("GRPOConfig.deepspeed: ZeRO partitions over processes; this run has one process")
    return True


def deepspeed_config(args: Any) -> dict[str, Any]:
    """The engine's configuration: the user's ``zero_optimization`` (and other sections grpokit does not
    decide), with grpokit's batch sizes and clipping; no precision mode, no optimizer or scheduler."""
    user = _user_config(args) or {}
    for owned in ("optimizer", "scheduler", "bf16", "fp16"):
        section = user.pop(owned, None)
        if owned in ("optimizer", "scheduler") and section is not None:
            raise ValueError(
                f"GRPOConfig.deepspeed: remove the '{owned}' section: grpokit passes its own AdamW and "
                "schedule (learning_rate, lr_scheduler_type, ...)"
            )
    zero = dict(user.pop("zero_optimization", None) or {})
    return {
        **{k: v for k, v in user.items() if v != "auto" and not k.startswith("train_")},
        "zero_optimization": {k: v for k, v in zero.items() if v != "auto"},
        "train_micro_batch_size_per_gpu": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "gradient_clipping": args.max_grad_norm if args.max_grad_norm and args.max_grad_norm > 0 else 0.0,
        "zero_allow_untested_optimizer": True,
    }


class ZeroEngine:
    """The DeepSpeed engine around ``runner`` (the module whose forward is the training pass over
    ``model``), and the update's two hooks into it."""

    def __init__(
        self,
        runner: torch.nn.Module,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        args: Any,
        autocast: Callable[[], AbstractContextManager[Any]] | None = None,
    ) -> None:
        """``autocast``: the trainer's mixed-precision context (``accelerator.autocast``), which the
        engine's forward runs under (None: none)."""
        import deepspeed

        if str(getattr(args, "mixed_precision", "no")) == "fp16" or getattr(args, "fp16", False):
            raise ValueError(
                "GRPOConfig.fp16 is not supported with DeepSpeed ZeRO: fp16 needs loss scaling, which the "
                "engine applies only in its own fp16 mode; use bf16=true (no loss scaling needed)"
            )
        self.model, self.stage = model, zero_stage(args)
        # stage 3: a copy to generate from, its tensors filled before each generation and released after
        self.generation_model = model
        if self.stage == 3:
            self.generation_model = copy.deepcopy(model)
            _release(self.generation_model)
        if autocast is not None:
            _run_forward_under(runner, autocast)
        _register_head(runner, model, self.stage)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=runner, optimizer=optimizer, config=deepspeed_config(args)
        )

    @property
    def scorer(self) -> torch.nn.Module:
        """What no-grad log-prob passes of the policy call (stage 3: the root, so the head is gathered)."""
        return self.engine.module if self.stage == 3 else self.model

    @contextmanager
    def for_generation(self) -> Iterator[None]:
        """Stage 3: the generation copy filled from the partitioned weights, one parameter gathered at a
        time (a collective), for the duration; its storage released after. Below stage 3: nothing."""
        if self.stage != 3:
            yield
            return
        copies = dict(self.generation_model.named_parameters())
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                with gathered_params(param):
                    copies[name].data = param.data.detach().clone()
        try:
            yield
        finally:
            _release(self.generation_model)

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Stage 3: the full weights on the CPU (a collective); below: None (the model's own are whole)."""
        return gathered_state(self.model) if self.stage == 3 else None

    @contextmanager
    def micro_batch(self, last: bool) -> Iterator[None]:
        """One micro-batch's forward and backward; ``last``: the last of grpokit's optimizer step, where the
        engine's step updates the weights (the boundary set explicitly, whatever DeepSpeed's counter says)."""
        self.engine.set_gradient_accumulation_boundary(last)
        yield

    def backward(self, loss: torch.Tensor) -> None:
        """One micro-batch: backward (the loss is already scaled for accumulation), then the engine's step,
        which only updates at the boundary ``micro_batch`` set."""
        self.engine.backward(loss, scale_wrt_gas=False)
        self.engine.step()

    def step_function(self, scheduler: Any) -> Callable[[float], torch.Tensor | None]:
        """``UpdateContext.step``: the engine stepped (and clipped) at the last micro-batch; here the
        schedule advances and the pre-clip norm is read back."""

        def step(max_norm: float) -> torch.Tensor | None:
            scheduler.step()
            norm = self.engine.get_global_grad_norm()
            return None if norm is None else torch.as_tensor(float(norm))

        return step


def _release(model: torch.nn.Module) -> None:
    """Free the storage of ``model``'s parameters; the modules (and tied parameters) stay."""
    for param in model.parameters():
        param.data = torch.empty(0, dtype=param.dtype, device=param.device)


def _run_forward_under(module: torch.nn.Module, context: Callable[[], AbstractContextManager[Any]]) -> None:
    """``module``'s forward runs inside ``context()`` (what ``accelerator.prepare`` does for the modules it
    wraps, here for the one DeepSpeed wraps)."""
    forward = module.forward

    @functools.wraps(forward)
    def forward_in_context(*args: Any, **kwargs: Any) -> Any:
        with context():
            return forward(*args, **kwargs)

    module.forward = forward_in_context


def _register_head(root: torch.nn.Module, model: torch.nn.Module, stage: int) -> None:
    """Stage 3: the LM head's weight is read inside the fused head, not by calling the module: DeepSpeed
    gathers it for the root's forward and backward."""
    if stage != 3:
        return
    import deepspeed

    head = model.get_output_embeddings()
    for param in (head.weight, head.bias):
        if param is not None:
            deepspeed.zero.register_external_parameter(root, param)


def partitioned_runner(runner: torch.nn.Module, model: torch.nn.Module, args: Any) -> torch.nn.Module:
    """Stage 3, a model that only scores (the reference): ``runner`` (its scoring pass over ``model``)
    partitioned by an inference-only engine; returns the module to call."""
    import deepspeed

    _register_head(runner, model, 3)
    config = {k: v for k, v in deepspeed_config(args).items() if k != "gradient_clipping"}
    engine, *_ = deepspeed.initialize(model=runner, config=config)
    return engine.module


@contextmanager
def gathered_params(*params: torch.nn.Parameter, modifier_rank: int | None = None) -> Iterator[None]:
    """The full tensors of stage-3 ``params`` for the duration (changes made on ``modifier_rank`` are
    kept); parameters DeepSpeed does not partition are left as they are. A collective."""
    import deepspeed

    partitioned = [p for p in params if hasattr(p, "ds_id")]
    if not partitioned:
        yield
        return
    with deepspeed.zero.GatheredParameters(partitioned, modifier_rank=modifier_rank):
        yield


def gathered_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full weights of a stage-3 ``module`` by name, on the CPU, one parameter gathered at a time (a
    collective: every process calls it)."""
    state = {}
    for name, param in module.named_parameters():
        with gathered_params(param):
            state[name] = param.detach().cpu().clone()
    return state


def load_gathered_state(module: torch.nn.Module, state: dict[str, torch.Tensor], *, is_main: bool) -> None:
    """Full weights into a stage-3 ``module``, one parameter at a time: the main process's ``state`` is
    copied into the gathered parameter and partitioned to every process (the others' ``state`` is not
    read). A collective."""
    with torch.no_grad():
        for name, param in module.named_parameters():
            with gathered_params(param, modifier_rank=0):
                if is_main:
                    param.copy_(state[name])
