"""Build the benchmark's tiny random Qwen2 checkpoint and its tokenizer locally (no hub).

The same directory is loaded by both sides of the benchmark with ``from_pretrained``, so both train exactly
the same weights. Runs in either virtual environment (needs only torch, transformers and tokenizers).
"""

from __future__ import annotations

import json
import os
import sys

VOCAB_SIZE = 8000
SPECIAL = ["<pad>", "<eos>", "<unk>"]  # ids 0, 1, 2


def word(i: int) -> str:
    """The i-th ordinary vocabulary word (deterministic, whitespace-free)."""
    return f"w{i}"


def build(out_dir: str, *, seed: int = 0, max_positions: int = 1024) -> str:
    """Write tokenizer + random-initialised Qwen2 (hidden 256, 4 layers, 4 heads, 2 KV heads) to out_dir."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    marker = os.path.join(out_dir, "grpokit_bench_model.json")
    if os.path.exists(marker):
        return out_dir
    os.makedirs(out_dir, exist_ok=True)
    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    for i in range(VOCAB_SIZE - len(SPECIAL)):
        vocab[word(i)] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    fast.padding_side = "left"
    fast.save_pretrained(out_dir)

    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 1
    model.save_pretrained(out_dir)
    with open(marker, "w") as f:
        json.dump({"seed": seed, "vocab_size": VOCAB_SIZE}, f)
    return out_dir


def synthetic_prompts(num_prompts: int, prompt_len: int, *, seed: int = 0) -> list[str]:
    """Whitespace-separated words; each prompt tokenizes to exactly ``prompt_len`` tokens."""
    import random

    rng = random.Random(seed)
    n_words = VOCAB_SIZE - len(SPECIAL)
    return [" ".join(word(rng.randrange(n_words)) for _ in range(prompt_len)) for _ in range(num_prompts)]


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/model"))
