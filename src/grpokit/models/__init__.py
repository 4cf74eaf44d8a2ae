"""Locally built models: a character tokenizer, tiny Qwen2/Llama policies and their supervised cold start."""

from grpokit.models.tiny import (
    ColdStartSettings,
    build_char_tokenizer,
    build_tiny_model,
    cold_start_policy,
    default_cache_root,
    default_num_threads,
)

__all__ = [
    "ColdStartSettings",
    "build_char_tokenizer",
    "build_tiny_model",
    "cold_start_policy",
    "default_cache_root",
    "default_num_threads",
]
