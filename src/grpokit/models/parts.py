"""Reaching into a ``transformers`` causal LM: its decoder (the backbone under the LM head), the cache a
forward returned, the device its weights are on. The lean training forward and the fast sampler run the
backbone themselves; this is where both find it."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["decoder_of", "model_device", "returned_cache"]


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


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter."""
    return next(model.parameters()).device
