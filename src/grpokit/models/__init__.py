"""Models built locally: a character tokenizer and tiny Qwen2/Llama policies (``tiny``), their supervised
cold start cached on disk (``cold_start``), loading a saved tokenizer exactly as saved (``loading``); a
decoder's sizes from its config alone (``shape``), the reaching into a model's backbone (``parts``) and the
replay-safe prompt caches of the training forward (``prefix_cache``) are imported from their modules."""

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
