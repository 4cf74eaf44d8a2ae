"""The names the generation backends answer to, one home each (plain strings, no torch: ``GRPOConfig`` makes
its field types from them, ``grpokit.config.choices``)."""

from __future__ import annotations

__all__ = ["GENERATION_BACKENDS", "VLLM_MODEL_IMPLS", "VLLM_MODES"]

GENERATION_BACKENDS = ("auto", "transformers", "fast")
"""``make_backend``'s names: ``auto`` picks ``fast`` where its decode supports the model, else
``transformers``."""

VLLM_MODES = ("colocate", "server")
"""Where the vLLM engine runs: in the training process (``vllm_backend``) or as a server (``vllm_client``)."""

VLLM_MODEL_IMPLS = ("vllm", "transformers", "auto")
"""vLLM's ``model_impl`` values: its own model code, ``transformers``' through vLLM, or vLLM's choice."""
