"""DeepSpeed ZeRO: AdamW's state (stage 1), the gradients (stage 2) and the weights (stage 3) partitioned
over the processes.

Requested by ``GRPOConfig.deepspeed`` (``"zero1"``/``"zero2"``, or as in TRL a DeepSpeed JSON file or
dict, whose ``zero_optimization`` section is used) or by ``accelerate launch`` with a DeepSpeed config
(``recipes/accelerate/deepspeed_zero2.yaml``: ``ACCELERATE_USE_DEEPSPEED``, ``ACCELERATE_DEEPSPEED_*``).

grpokit builds the engine itself (``deepspeed.initialize`` around ``PolicyLogprobs``, the module whose
forward is the lean log-prob pass), on CUDA and on CPU processes over gloo alike, with the run's own AdamW
and schedule; everything grpokit decides is set here, whatever the file says: the micro-batch, the number
of micro-batches per optimizer step, gradient clipping, and no DeepSpeed precision mode (mixed precision is
accelerate's autocast, as without DeepSpeed, so the weights stay in their own dtype and
``save_pretrained`` writes them whole). The update calls the engine's ``backward`` then ``step`` per
micro-batch, as DeepSpeed expects; the optimizer steps at the last micro-batch.

Stage 3: DeepSpeed gathers a module's weights around its forward and backward. The lean log-prob pass reads
the LM head's weight inside its fused chunked head rather than calling the module, so that weight is
registered as an external parameter of the ``PolicyLogprobs`` root (gathered for the root's forward and
backward). Generation reads weights directly too (the fast sampler's fused projections): it runs on a full
copy of the policy kept on each device and refreshed from the gathered weights before every generation
(the cost: one full copy of the weights per device, as FSDP's gather during generation). The reference is a
second, inference-only engine (partitioned the same way); its reset and checkpoints gather weights
explicitly (``gathered_params``).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
        self, runner: torch.nn.Module, model: torch.nn.Module, optimizer: torch.optim.Optimizer, args: Any
    ) -> None:
        import deepspeed

        self.model, self.stage = model, zero_stage(args)
        # stage 3: a full copy to generate from, taken before the weights are partitioned
        self.generation_model = copy.deepcopy(model) if self.stage == 3 else model
        policy = runner
        _register_head(policy, model, self.stage)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=policy, optimizer=optimizer, config=deepspeed_config(args)
        )

    @property
    def scorer(self) -> torch.nn.Module:
        """What no-grad log-prob passes of the policy call (stage 3: the root, so the head is gathered)."""
        return self.engine.module if self.stage == 3 else self.model

    @contextmanager
    def for_generation(self) -> Iterator[None]:
        """Stage 3: refresh the generation copy from the gathered weights first."""
        if self.stage == 3:
            copies = dict(self.generation_model.named_parameters())
            with gathered_params(self.model), torch.no_grad():
                for name, param in self.model.named_parameters():
                    copies[name].copy_(param)
        yield

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Stage 3: the full weights on the CPU (a collective); below: None (the model's own are whole)."""
        return gathered_state(self.model) if self.stage == 3 else None

    def backward(self, loss: torch.Tensor) -> None:
        """One micro-batch: backward (the loss is already scaled for accumulation), then the engine's step,
        which only updates at the last micro-batch of an optimizer step."""
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
def gathered_params(module: torch.nn.Module, modifier_rank: int | None = None) -> Iterator[None]:
    """The full weights of a stage-3 ``module`` for the duration (changes made on ``modifier_rank`` are
    kept); on other modules nothing happens."""
    import deepspeed

    params = [p for p in module.parameters() if hasattr(p, "ds_id")]
    if not params:
        yield
        return
    with deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank):
        yield


def gathered_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full weights of a stage-3 ``module`` by name, on the CPU (a collective: every process calls
    it)."""
    with gathered_params(module):
        return {name: p.detach().cpu().clone() for name, p in module.named_parameters()}


def load_gathered_state(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Full weights into a stage-3 ``module`` (a collective; every process reads the same state)."""
    with gathered_params(module, modifier_rank=0), torch.no_grad():
        for name, param in module.named_parameters():
            param.copy_(state[name])
