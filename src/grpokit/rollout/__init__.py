"""Generation backends behind one protocol (:class:`RolloutBackend`), and the records of one step.

``transformers``' ``generate`` (``hf``), grpokit's fast sampler (``fast``, with ``native_decode`` for
Llama-family models and ``logits`` for the sampling distribution), vLLM (``vllm_backend``,
``vllm_client``), a scripted in-memory backend for tests (``fake``); ``records``: Samples, Scores and
RolloutBatch, the records a step passes along.

The names below load their module on first use, so that ``grpokit.rollout.choices`` (the backends' names:
plain strings) is importable without torch or transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "backends": ("make_backend", "resolve_backend_name"),
    "base": ("GenerationOutput", "RolloutBackend", "SamplingParams", "generate_groups"),
    "choices": ("GENERATION_BACKENDS",),
    "fake": ("ScriptedBackend",),
    "fast": ("FastSampler",),
    "hf": ("TransformersBackend",),
    "logits": ("process_logits", "sample_token"),
}
"""module -> the public names it defines."""

_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    """Import the module that defines ``name`` on first use (PEP 562)."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
