"""Reaching into a ``transformers`` causal LM: its decoder (the backbone under the LM head), the cache a
forward returned, the device its weights are on, the dtype autocast computes in. The lean training forward
and the fast sampler run the backbone themselves; this is where both find it."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

__all__ = [
    "autocast_dtype",
    "cache_argument",
    "cast",
    "decoder_of",
    "hf_model",
    "linear_weight",
    "model_device",
    "returned_cache",
]


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype autocast runs matmuls in on ``device``; None where autocast is off."""
    if not torch.is_autocast_enabled(device.type):
        return None
    return torch.get_autocast_dtype(device.type)


def cast(tensor: torch.Tensor | None, dtype: torch.dtype | None) -> torch.Tensor | None:
    """``tensor`` in ``dtype``, as autocast casts a product's operands; ``None`` (no tensor, or no dtype to
    cast to) leaves it as it is."""
    return tensor if tensor is None or dtype is None else tensor.to(dtype)


def hf_model(model: torch.nn.Module) -> torch.nn.Module:
    """The ``transformers`` model under a PEFT wrapper (itself otherwise)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The backbone that turns token ids into hidden states: ``get_decoder()``, else ``base_model``."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    return decoder if decoder is not None else model.base_model


def returned_cache(out: Any, fallback: Any) -> Any:
    """The key/value cache a forward returned (``cache`` or ``past_key_values``), else ``fallback``."""
    for name in ("cache", "past_key_values"):
        value = getattr(out, name, None)
        if value is not None:
            return value
    return fallback


def cache_argument(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """``{name: cache}`` for ``model``'s forward: ``cache`` (``transformers`` >= 5.2x, which deprecates the
    old name) or ``past_key_values`` (earlier releases, e.g. the 5.17-5.19 that vLLM 0.31-0.32 pin, where an
    unknown ``cache=`` would be silently ignored and the forward would run without the cache). A PEFT model
    passes it on to its base model, whose signature decides."""
    return {_cache_name(type(hf_model(model))): cache}


@functools.cache
def _cache_name(model_class: type) -> str:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter."""
    return next(model.parameters()).device


def linear_weight(module: torch.nn.Module) -> torch.Tensor | None:
    """The [out, in] weight a linear layer applies to its input, for code that fuses several projections
    into one matmul.

    ``nn.Linear``: its weight. A PEFT LoRA layer with its adapters active and not merged: base + sum over
    the active adapters of ``scaling * B @ A``, computed into a new tensor (the base weight is never merged
    in place: unmerging later would not restore it bit for bit, and the base weights are the reference
    model). Disabled or merged adapters: the base weight. ``None`` for what one weight cannot express
    (DoRA and other LoRA variants, adapter biases, other PEFT tuners, non-linear modules).
    """
    if isinstance(module, torch.nn.Linear):
        return module.weight
    get_base = getattr(module, "get_base_layer", None)
    if get_base is None or not hasattr(module, "lora_A") or not hasattr(module, "get_delta_weight"):
        return None
    base = get_base()
    if not isinstance(base, torch.nn.Linear):
        return None
    weight = base.weight
    if module.disable_adapters or module.merged:
        return weight
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        if name in getattr(module, "lora_variant", {}) or module.lora_B[name].bias is not None:
            return None
        weight = weight + module.get_delta_weight(name).to(weight.dtype)  # [out, in]
    return weight
