"""Locally built models: a character tokenizer, tiny Qwen2/Llama policies and their supervised cold start."""

from grpokit.models.tiny import (
    COLD_START_THREADS,
    ColdStartSettings,
    build_char_tokenizer,
    build_tiny_model,
    cold_start_policy,
    default_cache_root,
)

__all__ = [
    "COLD_START_THREADS",
    "ColdStartSettings",
    "build_char_tokenizer",
    "build_tiny_model",
    "cold_start_policy",
    "default_cache_root",
]
