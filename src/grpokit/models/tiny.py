"""A tiny policy built entirely locally: a character-level tokenizer and a small Qwen2/Llama model.

Nothing here touches a model hub. The tokenizer is made with the ``tokenizers`` library and wrapped as a
``transformers.PreTrainedTokenizerFast``; the model is a ``transformers`` architecture built from a config
with seeded random weights. Both save with ``save_pretrained`` and load back with ``AutoTokenizer`` /
``AutoModelForCausalLM``. The supervised cold start that turns them into a policy GRPO can improve is
``grpokit.tasks.cold_start``.
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

__all__ = [
    "BOS_TOKEN",
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "MOE_ARCHITECTURES",
    "PAD_TOKEN",
    "UNK_TOKEN",
    "build_char_tokenizer",
    "build_tiny_model",
    "build_tiny_moe",
    "with_generation_ids",
]

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
UNK_TOKEN = "<|unk|>"
DEFAULT_TAGS = ("<answer>", "</answer>", "<think>", "</think>")
# Printable ASCII (digits, letters, punctuation, space) and newline: any English prompt tokenizes.
DEFAULT_ALPHABET = "".join(sorted(set(string.printable) - set("\t\r\x0b\x0c")))

# A transparent chat template: a user message renders as its content, so a conversational prompt
# [{"role": "user", "content": "23+45-17="}] gives exactly the token ids of the plain prompt "23+45-17=",
# and a policy trained on plain prompts works on both formats. System messages end with a newline;
# assistant messages end with EOS. The generation prompt is empty (the prompt's own "=" cues the answer).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{{ message['content'] + '\\n' }}"
    "{%- elif message['role'] == 'assistant' -%}{{ message['content'] + eos_token }}"
    "{%- else -%}{{ message['content'] }}"
    "{%- endif -%}"
    "{%- endfor -%}"
)


def build_char_tokenizer(
    alphabet: str = DEFAULT_ALPHABET,
    tags: Iterable[str] = DEFAULT_TAGS,
    model_max_length: int = 256,
) -> PreTrainedTokenizerFast:
    """One token per character of ``alphabet``, one token per tag, and special tokens bos/eos/pad/unk.

    Ids: 0 pad, 1 bos, 2 eos, 3 unk, then the alphabet in sorted order, then the tags. Encoding adds no
    special tokens (a prompt's ids are the same with or without ``add_special_tokens``); EOS ends every
    trained completion. Tags (``<answer>`` ...) are ordinary added tokens, so they survive
    ``decode(..., skip_special_tokens=True)``. Characters outside the alphabet map to unk.
    """
    specials = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN]
    chars = sorted(set(alphabet))
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in chars:
        vocab[ch] = len(vocab)
    # BPE with no merges splits text into single characters; Fuse joins them back without separators.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN, fuse_unk=False))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(specials)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )
    tokenizer.add_tokens([t for t in tags if t not in tokenizer.get_vocab()])
    return tokenizer


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast,
    arch: str = "llama",
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 256,
    tie_word_embeddings: bool = True,
    seed: int = 0,
) -> PreTrainedModel:
    """A randomly initialised ``arch`` ("qwen2" or "llama") causal LM sized for ``tokenizer``.

    Weights come from ``torch.manual_seed(seed)`` (the global RNG is restored afterwards). bos/eos/pad ids
    are written into the config and the generation config, so ``generate`` stops at EOS and pads with pad.
    ``intermediate_size`` defaults to 4 x ``hidden_size``; ``num_kv_heads`` to ``num_heads``.

    Default "llama": saved next to a Llama config, ``AutoTokenizer.from_pretrained(dir)`` returns the
    character tokenizer exactly as built. Next to a "qwen2" config, transformers 5 forces its own
    ``Qwen2Tokenizer`` pipeline (byte-level pre-tokenizer, NFC), which drops whitespace; load such a
    directory with ``PreTrainedTokenizerFast.from_pretrained`` (``grpokit.models.loading.load_tokenizer``).
    Digits, ``+``, ``=`` and the tags still encode identically either way.
    """
    if arch not in ("qwen2", "llama"):
        raise ValueError(f"arch must be 'qwen2' or 'llama', got {arch!r}")
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
    config = AutoConfig.for_model(
        arch,
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads,
        intermediate_size=intermediate_size or 4 * hidden_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return seeded_model(config, tokenizer, seed)


MOE_ARCHITECTURES: dict[str, dict[str, object]] = {
    "qwen3_moe": {
        "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
    },
    "qwen2_moe": {
        "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16, "num_experts": 8,
        "num_experts_per_tok": 2,
    },
    "mixtral": {"intermediate_size": 16, "num_local_experts": 8, "num_experts_per_tok": 2},
    "olmoe": {"intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2},
    "gpt_oss": {
        "intermediate_size": 16, "num_local_experts": 8, "num_experts_per_tok": 2,
        "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8,
    },
    "glm4_moe": {
        "moe_intermediate_size": 16, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 2,
        "topk_group": 1, "first_k_dense_replace": 1, "n_shared_experts": 1, "partial_rotary_factor": 0.5,
    },
}  # fmt: skip
"""The mixture-of-experts architectures ``build_tiny_moe`` makes (transformers 5), each with 8 experts of
which 2 per token, and the config fields that make them so. GPT-OSS alternates sliding and full attention
as the released models do; GLM-4-MoE's first layer is dense, as in GLM-4.5."""


def build_tiny_moe(
    tokenizer: PreTrainedTokenizerFast,
    arch: str = "qwen3_moe",
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    expert_size: int | None = None,
    seed: int = 0,
    **overrides: object,
) -> PreTrainedModel:
    """A randomly initialised mixture-of-experts causal LM of ``arch`` (``MOE_ARCHITECTURES``) sized for
    ``tokenizer``, with the experts as ``transformers`` stores them (3-D expert weights, its grouped matmul).
    ``expert_size``: each expert's MLP width (default 16). ``overrides``: further config fields (e.g.
    ``num_experts_per_tok``). Weights from ``torch.manual_seed(seed)`` (the global RNG restored afterwards);
    bos/eos/pad ids in the config and generation config."""
    if arch not in MOE_ARCHITECTURES:
        raise ValueError(f"arch must be one of {sorted(MOE_ARCHITECTURES)}, got {arch!r}")
    fields = {"intermediate_size": 2 * hidden_size, **MOE_ARCHITECTURES[arch]}
    if expert_size is not None:  # the experts' width: its own field where the model has a dense MLP too
        width = "moe_intermediate_size" if "moe_intermediate_size" in fields else "intermediate_size"
        fields[width] = expert_size
    fields.update(overrides)
    config = AutoConfig.for_model(
        arch,
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **fields,
    )
    if arch == "gpt_oss":  # its default YaRN scaling assumes a 4k original context
        config.rope_parameters = {"rope_type": "default", "rope_theta": 150000.0}
    return seeded_model(config, tokenizer, seed)


def seeded_model(config: Any, tokenizer: PreTrainedTokenizerFast, seed: int) -> PreTrainedModel:
    """A float32 causal LM of ``config`` with weights from ``torch.manual_seed(seed)`` (the global RNG
    restored afterwards) and the tokenizer's ids in its generation config."""
    rng_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    finally:
        torch.random.set_rng_state(rng_state)
    return with_generation_ids(model, tokenizer)


def with_generation_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    """``model`` with the tokenizer's bos/eos/pad ids in its generation config, so ``generate`` stops at
    EOS and pads with pad."""
    gen = model.generation_config
    gen.bos_token_id, gen.eos_token_id, gen.pad_token_id = (
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )
    return model
