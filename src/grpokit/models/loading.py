"""Loading a saved tokenizer exactly as it was saved, and the id it pads with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerFast

__all__ = ["load_processor", "load_tokenizer", "pad_token_id"]


def load_tokenizer(path: str, *, trust_remote_code: bool = False) -> Any:
    """The tokenizer saved in ``path``, exactly as saved.

    ``AutoTokenizer`` picks the tokenizer class from the model's ``config.json`` when the directory has one,
    so a generic tokenizer saved next to a Qwen2/Llama model (``tokenizer_class`` "TokenizersBackend" or
    "PreTrainedTokenizerFast", like ``grpokit.models.tiny.build_char_tokenizer``'s) would come back with that
    architecture's pre-tokenizer and normaliser, silently dropping spaces and newlines. Such tokenizers are
    loaded as ``PreTrainedTokenizerFast`` instead; every other class through ``AutoTokenizer``.
    """
    config = Path(path) / "tokenizer_config.json"
    if config.exists():
        tokenizer_class = json.loads(config.read_text()).get("tokenizer_class")
        if tokenizer_class in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            return PreTrainedTokenizerFast.from_pretrained(path)
    if trust_remote_code:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    return AutoTokenizer.from_pretrained(path)


def load_processor(path: str, *, trust_remote_code: bool = False) -> Any:
    """A vision-language model's processor saved in ``path`` (``AutoProcessor``), its tokenizer loaded as
    :func:`load_tokenizer` loads it (a generic tokenizer kept exactly as saved)."""
    from transformers import AutoProcessor

    remote = {"trust_remote_code": True} if trust_remote_code else {}
    processor = AutoProcessor.from_pretrained(path, **remote)
    tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code)
    if type(tokenizer) is not type(processor.tokenizer):  # AutoProcessor chose the architecture's pipeline
        processor.tokenizer = tokenizer
    return processor


def pad_token_id(tokenizer: Any, model: Any | None = None) -> int:
    """The id used for padding: the tokenizer's pad, else its EOS, else the model config's pad, else 0."""
    for value in (
        getattr(tokenizer, "pad_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
        getattr(getattr(model, "config", None), "pad_token_id", None),
    ):
        if isinstance(value, int):
            return value
    return 0
