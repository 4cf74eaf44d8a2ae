"""A byte-level BPE tokenizer whose hand-written merges make tokens that straddle step boundaries (the
character tokenizer ``char_tok`` is in tests/conftest.py)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast


@pytest.fixture(scope="session")
def merge_tok():
    """Characters of the chain task plus merges "5"+"\\n" -> "5\\n" and "5\\n"+"2" -> "5\\n2" (a token holding
    the end of one step and the start of the next), and "2"+"5" -> "25"."""
    alphabet = "0123456789+-*=\n<>/answer"
    vocab = {"<eos>": 0}
    for ch in sorted(set(alphabet)):
        vocab[ch] = len(vocab)
    for tok in ("5\n", "5\n2", "25"):
        vocab[tok] = len(vocab)
    merges = [("5", "\n"), ("5\n", "2"), ("2", "5")]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<eos>", clean_up_tokenization_spaces=False
    )
