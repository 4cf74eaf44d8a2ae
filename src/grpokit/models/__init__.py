"""Models built locally: a character tokenizer and tiny Qwen2/Llama policies (``tiny``), their supervised
cold start cached on disk (``cold_start``), and loading a saved tokenizer exactly as saved (``loading``)."""

from grpokit.models.cold_start import (
    COLD_START_THREADS,
    ColdStartSettings,
    cold_start_policy,
    default_cache_root,
)
from grpokit.models.loading import load_tokenizer, pad_token_id
from grpokit.models.tiny import CHAT_TEMPLATE, build_char_tokenizer, build_tiny_model

__all__ = [
    "CHAT_TEMPLATE",
    "COLD_START_THREADS",
    "ColdStartSettings",
    "build_char_tokenizer",
    "build_tiny_model",
    "cold_start_policy",
    "default_cache_root",
    "load_tokenizer",
    "pad_token_id",
]
