"""DeepSpeed ZeRO stages 1 and 2: AdamW's state (stage 1) and the gradients (stage 2) partitioned over the
processes, the weights replicated.

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

Stage 3 (partitioned weights) is refused: the lean log-prob pass and the fast sampler read weights directly
rather than through module calls; FSDP (``fsdp=full_shard``) shards the weights instead.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = ["SHORTHANDS", "ZeroEngine", "deepspeed_config", "zero_requested"]

SHORTHANDS = {"zero1": 1, "zero2": 2, "zero3": 3}
"""``GRPOConfig.deepspeed`` values that name a ZeRO stage (3 is refused with a message)."""


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


def zero_requested(args: Any, num_processes: int) -> bool:
    """Whether this run uses DeepSpeed ZeRO (``args.deepspeed`` or ``accelerate launch``); refuses stage 3
    and a single process with a message."""
    config = _user_config(args)
    if config is None:
        return False
    stage = int((config.get("zero_optimization") or {}).get("stage", 0))
    if stage == 3:
        raise ValueError(
            "DeepSpeed ZeRO-3 is not supported: it partitions the weights that grpokit's lean log-prob pass "
            "and fast sampler read directly. Shard the weights with FSDP instead (fsdp: full_shard, or "
            "accelerate launch --config_file recipes/accelerate/fsdp.yaml); ZeRO-1/2 work. See "
            "docs/scaling.md"
        )
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
    """The DeepSpeed engine around ``PolicyLogprobs(model)``, and the update's two hooks into it."""

    def __init__(self, policy: torch.nn.Module, optimizer: torch.optim.Optimizer, args: Any) -> None:
        import deepspeed

        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=policy, optimizer=optimizer, config=deepspeed_config(args)
        )

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
