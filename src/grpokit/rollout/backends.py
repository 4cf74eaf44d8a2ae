"""Choosing the generation backend by its config name ("auto" picks one for the model)."""

from __future__ import annotations

import logging

import torch

from grpokit.rollout.base import RolloutBackend
from grpokit.rollout.choices import GENERATION_BACKENDS

__all__ = ["GENERATION_BACKENDS", "make_backend", "resolve_backend_name"]

logger = logging.getLogger(__name__)
_logged: set[tuple[str, str]] = set()


def resolve_backend_name(name: str, model: torch.nn.Module) -> str:
    """``"auto"`` -> ``"fast"`` where the fast sampler's shared-prefix decode supports ``model``
    (``rollout.native_decode.native_supported``: the architecture, and LoRA adapters it can fuse), else
    ``"transformers"``; the choice is logged once per model type. Other names are returned unchanged."""
    if name != "auto":
        return name
    from grpokit.rollout.native_decode import native_supported

    chosen = "fast" if native_supported(model) else "transformers"
    model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    if (model_type, chosen) not in _logged:
        _logged.add((model_type, chosen))
        if chosen == "fast":
            logger.info("generation_backend=auto: the fast sampler for this %s model", model_type)
        else:
            logger.warning(
                "generation_backend=auto: model.generate for this %s model (the fast sampler's decode "
                "supports llama, qwen2, qwen3, mistral without a sliding window, qwen2_moe, qwen3_moe and "
                "mixtral)",
                model_type,
            )
    return chosen


def make_backend(
    name: str,
    model: torch.nn.Module,
    *,
    micro_batch_size: int | None = None,
    compile_decode: bool = False,
    padding_free: bool | None = None,
) -> RolloutBackend:
    """``"transformers"``: ``model.generate``; ``"fast"``: grpokit's sampler (shared prompt prefill,
    pre-allocated KV cache); ``"auto"``: ``resolve_backend_name``. Both read the live weights of ``model``
    and generate for at most ``micro_batch_size`` prompts per call (None: all at once), which bounds the KV
    cache. ``compile_decode``: the fast sampler's decode step through ``torch.compile`` (a ValueError where
    the chosen backend is not the fast sampler's native decode). ``padding_free``: the fast sampler's
    prefill over the prompts' real tokens packed (``FastSampler.padding_free``; ``model.generate`` pads)."""
    name = resolve_backend_name(name, model)
    if name == "transformers":
        if compile_decode:
            raise ValueError(
                "compile_decode compiles the fast sampler's decode step, and the generation backend for this "
                f"{type(model).__name__} is model.generate; set compile_decode=False"
            )
        from grpokit.rollout.hf import TransformersBackend

        return TransformersBackend(model, micro_batch_size=micro_batch_size)
    if name == "fast":
        from grpokit.rollout.fast import FastSampler

        return FastSampler(
            model, prompts_per_call=micro_batch_size, compile_decode=compile_decode, padding_free=padding_free
        )
    raise ValueError(f"generation_backend must be one of {GENERATION_BACKENDS}, got {name!r}")
