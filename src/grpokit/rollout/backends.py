"""Choosing the generation backend by its config name."""

from __future__ import annotations

import torch

from grpokit.rollout.base import RolloutBackend

__all__ = ["GENERATION_BACKENDS", "make_backend"]

GENERATION_BACKENDS = ("transformers", "fast")


def make_backend(name: str, model: torch.nn.Module, *, micro_batch_size: int | None = None) -> RolloutBackend:
    """``"transformers"``: ``model.generate``; ``"fast"``: grpokit's sampler (shared prompt prefill,
    pre-allocated KV cache). Both read the live weights of ``model`` and generate for at most
    ``micro_batch_size`` prompts per call (None: all at once), which bounds the KV cache."""
    if name == "transformers":
        from grpokit.rollout.hf import TransformersBackend

        return TransformersBackend(model, micro_batch_size=micro_batch_size)
    if name == "fast":
        from grpokit.rollout.fast import FastSampler

        return FastSampler(model, prompts_per_call=micro_batch_size)
    raise ValueError(f"generation_backend must be one of {GENERATION_BACKENDS}, got {name!r}")
