"""The optimizer and its learning-rate schedule: AdamW and the ``lr_scheduler_type`` schedule from the
config, or TRL's ``optimizers=(optimizer, lr_scheduler)`` argument (either may be None)."""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import get_scheduler

from grpokit.config import GRPOConfig

__all__ = ["build_optimizers"]

logger = logging.getLogger(__name__)


def build_optimizers(
    model: torch.nn.Module,
    args: GRPOConfig,
    total_optimizer_steps: int,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
) -> tuple[torch.optim.Optimizer, Any]:
    """``(optimizer, scheduler)``: the given ones, else AdamW (``optim``: the fused kernel or the default
    one) over the trainable parameters and the configured schedule (with warm-up, ``lr_scheduler_kwargs``)
    over ``total_optimizer_steps``."""
    if optimizer is None:
        optimizer = _adamw([p for p in model.parameters() if p.requires_grad], args)
    if scheduler is None:
        scheduler = get_scheduler(
            args.lr_scheduler_type,
            optimizer,
            num_warmup_steps=args.num_warmup_steps(total_optimizer_steps),
            num_training_steps=total_optimizer_steps,
            scheduler_specific_kwargs=dict(args.lr_scheduler_kwargs or {}),
        )
    return optimizer, scheduler


def _adamw(params: list[torch.nn.Parameter], args: GRPOConfig) -> torch.optim.Optimizer:
    """AdamW; with ``optim="adamw_torch_fused"`` (the default, as TRL's) its fused kernel: one pass over
    each parameter without temporaries, where torch has it for every parameter's device and dtype, else the
    plain implementation (logged; torch itself would only fail at the first step)."""
    options = dict(
        lr=args.learning_rate,
        betas=(args.adam_beta1, args.adam_beta2),
        eps=args.adam_epsilon,
        weight_decay=args.weight_decay,
    )
    if args.optim == "adamw_torch_fused":
        devices = _fused_kernel_devices()
        unsupported = sorted(
            {
                f"{p.device.type}/{p.dtype}"
                for p in params
                if p.device.type not in devices or not p.is_floating_point()
            }
        )
        if not unsupported:
            return torch.optim.AdamW(params, fused=True, **options)
        logger.warning("optim=adamw_torch_fused: no fused kernel for %s; using the plain AdamW", unsupported)
    return torch.optim.AdamW(params, **options)


def _fused_kernel_devices() -> list[str]:
    """The device types torch's fused AdamW kernel runs on (for floating-point parameters)."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return _get_fused_kernels_supported_devices()
    except ImportError:  # torch moved its private helper: the devices it had in 2.13
        return ["mps", "cuda", "xpu", "hpu", "cpu", "mtia"]
