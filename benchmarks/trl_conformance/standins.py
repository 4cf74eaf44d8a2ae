"""Local stand-ins for the Hub models and data sets TRL's GRPO tests load, in a Hugging Face cache.

    python benchmarks/trl_conformance/standins.py [--hf-home DIR] [--force] [--check]

Writes ``DIR`` (default ``benchmarks/trl_conformance/.hf_home``) so that, with ``HF_HOME=DIR``,
``HF_HUB_OFFLINE=1`` and ``HF_DATASETS_OFFLINE=1``, the tests' own calls resolve unchanged:

* ``AutoModelForCausalLM.from_pretrained("trl-internal-testing/tiny-Qwen2ForCausalLM-2.5")`` and the other
  tiny models: the hub cache layout ``hub/models--org--name/snapshots/<hash>/`` plus ``refs/main``;
* ``load_dataset("trl-internal-testing/zen", "standard_prompt_only")``: the datasets cache layout
  ``datasets/trl-internal-testing___zen/<config>/0.0.0/<hash>/`` that ``datasets`` falls back to offline.

Nothing is downloaded. Shapes follow TRL's tiny-model scripts (``scripts/generate_tiny_models/`` in TRL's
repository: a few hidden units, two layers, bf16 weights, the real model family's config class and
generation config) and its ``scripts/generate_zen_dataset.py`` (Zen-of-Python prompts, 19 rows, 10% test
split without shuffling). What differs from the Hub originals:

* Tokenizers are built here: byte-level BPE (GPT-2 byte alphabet, and merges learned from the chat
  templates' text, a tool schema and the Zen of Python; deterministic) with each family's special tokens.
  The Qwen family keeps Qwen's real vocabulary size and ids for the byte tokens, the special tokens, and
  the few word tokens TRL's tests hard-code (tool-call tests decode fixed Qwen ids such as 151657
  ``<tool_call>`` or 17453 ``Done``; the strings are read off those tests' comments); the learned pieces
  take free ids and every other id decodes to a placeholder ``t<id>``. Other families get a compact vocab.
* Chat templates are the families' original templates as shipped inside the installed TRL package
  (``trl/chat_templates/*.jinja``, which TRL itself uses to recognise a model), so this script must run
  with a Python that has ``trl`` installed (run.sh uses TRL's environment).
* Weights are random (seeded), not TRL's; no model card. TRL's GPU-only models are not built (the tests that
  need them are reported as "stand-in not built").
* Vision-language models (Qwen2-VL, Qwen2.5-VL, Qwen3.5, Qwen3.6-MoE, Gemma 3, Gemma 4, LLaVA-NeXT):
  shapes as TRL's for_conditional_generation scripts (the real model's config with the script's overrides; the
  real config's fields are reconstructed below, some from memory), the architecture's processor class with
  image and video processors, the family's image/vision tokens at their real ids (Gemma and LLaVA-NeXT get
  their real vocabulary size here, special tokens at the real ids, placeholders elsewhere). Their processors
  need torchvision (see README.md). Data: zen-image and zen-multi-image with seeded random images.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import importlib.util
import io
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_HF_HOME = HERE / ".hf_home"
ORG = "trl-internal-testing"
# Bump when a stand-in changes: it is part of each snapshot's hash and of the "built" marker.
STANDIN_VERSION = "3"
# Qwen2's pre-tokenizer split (transformers' Qwen2Tokenizer)
QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map; its order gives the byte tokens' ids 0..255."""
    bs = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _byte_level(text: str) -> str:
    table = bytes_to_unicode()
    return "".join(table[b] for b in text.encode("utf-8"))


def _byte_token_order() -> list[str]:
    """Byte-level characters in id order (GPT-2 and Qwen: printable ranges first, then the remapped bytes)."""
    table = bytes_to_unicode()
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), 256))
    rest = [b for b in range(256) if b not in printable]
    return [table[b] for b in printable + rest]


# Qwen2/Qwen3 ids that TRL's GRPO tests hard-code in fake generations, with the text their comments give.
# Ids below 256 are byte tokens and need no entry.
QWEN_WORD_TOKENS = {
    293: " b",
    314: " {",
    330: ' "',
    397: ">\n",
    411: "out",
    450: "de",
    497: '",',
    522: "</",
    606: "name",
    788: '":',
    894: " any",
    927: "sh",
    944: "'t",
    1318: "text",
    1414: " know",
    1513: " don",
    2765: " won",
    4913: '{"',
    5212: ' {"',
    5392: " tool",
    6023: "hi",
    6659: "call",
    7692: "async",
    9520: "step",
    11248: "}}\n",
    13477: "crement",
    14172: "tool",
    16252: " increment",
    16370: "arguments",
    17453: "Done",
    22785: "_tool",
    35744: "increment",
    64648: "multiply",
    93054: "_multiply",
    95642: '"}}\n',
}
# Qwen2.5's added tokens from id 151643 (special unless listed in QWEN_NON_SPECIAL); Qwen3 adds four more.
QWEN25_ADDED = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]  # fmt: skip
QWEN3_ADDED = [*QWEN25_ADDED, "<tool_response>", "</tool_response>", "<think>", "</think>"]
QWEN_NON_SPECIAL = {
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
}  # fmt: skip
QWEN_FIRST_ADDED_ID = 151643


@dataclass
class TokenizerSpec:
    """A byte-level tokenizer: ``added`` tokens follow the byte tokens (or start at ``first_added_id``)."""

    added: list[str]
    non_special: set[str] = field(default_factory=set)
    first_added_id: int | None = None  # None: right after the byte tokens
    word_tokens: dict[int, str] = field(default_factory=dict)
    bos: str | None = None
    eos: str | None = None
    pad: str | None = None
    unk: str | None = None
    template: str | None = None  # file name in trl/chat_templates
    tokenizer_class: str = "PreTrainedTokenizerFast"
    model_max_length: int = 131072
    # Special tokens at fixed (real) ids anywhere in the vocabulary (the byte tokens and learned pieces take
    # the lowest ids left free); every id up to vocab_size that nothing else takes is a placeholder ``t<id>``.
    tokens_at: dict[int, str] = field(default_factory=dict)
    vocab_size: int | None = None
    # Named extra special tokens (tokenizer attributes such as image_token, boi_token) the processors read.
    extra_special: dict[str, str] = field(default_factory=dict)


def _trl_chat_template(name: str) -> str:
    spec = importlib.util.find_spec("trl")
    if spec is None or spec.origin is None:
        raise SystemExit(
            "standins.py reads chat templates from the installed trl package: run it with TRL's Python"
        )
    return (Path(spec.origin).parent / "chat_templates" / name).read_text(encoding="utf-8")


def _pre_tokenizer():
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


# Text the merges are learned from: the chat templates' own text (system prompts, tool instructions), a
# tool's JSON schema, the Zen of Python. With merges, prompts encode to a length like the real tokenizers'
# (byte-per-token prompts are 3-4 times longer, and the tool tests' backward pass over Qwen's 151,936-entry
# vocabulary then takes minutes on a CPU).
MERGE_CORPUS_TEMPLATES = [
    "qwen2_5.jinja", "qwen3.jinja", "llama3_2.jinja", "gemma.jinja", "cohere2.jinja", "glm4moe.jinja",
    "gptoss.jinja", "nemotron_3_nano.jinja",
]  # fmt: skip
MERGE_CORPUS_TEXT = [
    '{"type": "function", "function": {"name": "multiply_tool", "description": "Multiplies two integers.", '
    '"parameters": {"type": "object", "properties": {"a": {"type": "integer", "description": "The first '
    'integer."}, "b": {"type": "integer", "description": "The second integer."}}, "required": ["a", "b"]}, '
    '"return": {"type": "integer", "description": "The product of the two integers."}}}',
    '<tool_call>\n{"name": "increment", "arguments": {"step": 1}}\n</tool_call>',
    "You are a helpful assistant. Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n",
]
MERGE_VOCAB_SIZE = 3000


@functools.cache
def _learned_merges() -> tuple[list[str], list[tuple[str, str]]]:
    """Byte-level BPE merges learned from MERGE_CORPUS_*: (new tokens in merge order, merges)."""
    with contextlib.redirect_stdout(io.StringIO()):  # importing `this` prints the Zen of Python
        import this
    from tokenizers import Tokenizer, decoders, trainers
    from tokenizers.models import BPE

    zen = "".join(this.d.get(c, c) for c in this.s)
    corpus = [_trl_chat_template(name) for name in MERGE_CORPUS_TEMPLATES]
    corpus += [*MERGE_CORPUS_TEXT, zen, *ZEN_STANDARD_PROMPTS, *ZEN_CONVERSATIONAL_QUESTIONS]
    tok = Tokenizer(BPE())
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=MERGE_VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=_byte_token_order(),
    )
    tok.train_from_iterator(corpus * 2, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    new_tokens = [a + b for a, b in merges]
    return new_tokens, merges


def build_tokenizer(spec: TokenizerSpec):
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    taken = set(spec.tokens_at) | set(spec.word_tokens)
    next_free = (i for i in range(10**7) if i not in taken)
    vocab: dict[str, int] = {tok: next(next_free) for tok in _byte_token_order()}  # 0..255 unless taken
    for i, text in spec.word_tokens.items():
        vocab[_byte_level(text)] = i
    new_tokens, merges = _learned_merges()
    first_added = spec.first_added_id if spec.first_added_id is not None else len(vocab) + len(new_tokens)
    for token in new_tokens:
        if token not in vocab:
            vocab[token] = next(next_free)
    for k, tok in enumerate(spec.added):
        # with tokens at fixed ids below, the compact families' added tokens take the next free ids instead
        vocab[tok] = next(next_free) if spec.tokens_at and spec.first_added_id is None else first_added + k
    for i, tok in spec.tokens_at.items():
        vocab[tok] = i
    used = set(vocab.values())
    for i in range(max(spec.vocab_size or 0, max(used) + 1)):
        if i not in used:
            vocab[f"t{i}"] = i  # placeholder: decodes to the text "t<id>"
    assert len(set(vocab.values())) == len(vocab) == max(vocab.values()) + 1, "ids must be 0..n-1, unique"

    backend = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = _pre_tokenizer()
    backend.decoder = decoders.ByteLevel()
    backend.add_tokens(
        [
            AddedToken(tok, special=tok not in spec.non_special, normalized=False)
            for tok in [*spec.added, *spec.tokens_at.values()]
        ]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=spec.bos,
        eos_token=spec.eos,
        pad_token=spec.pad,
        unk_token=spec.unk,
        model_max_length=spec.model_max_length,
        clean_up_tokenization_spaces=False,
        **({"extra_special_tokens": dict(spec.extra_special)} if spec.extra_special else {}),
    )
    if spec.template:
        tokenizer.chat_template = _trl_chat_template(spec.template)
    return tokenizer


def save_tokenizer(tokenizer, spec: TokenizerSpec, directory: Path) -> None:
    tokenizer.save_pretrained(directory)
    # Record the family's tokenizer class the way Hub repos do.
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = spec.tokenizer_class
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


QWEN25 = TokenizerSpec(
    added=QWEN25_ADDED,
    non_special=QWEN_NON_SPECIAL,
    first_added_id=QWEN_FIRST_ADDED_ID,
    word_tokens=QWEN_WORD_TOKENS,
    eos="<|im_end|>",
    pad="<|endoftext|>",
    template="qwen2_5.jinja",
    tokenizer_class="Qwen2Tokenizer",
)
QWEN3 = TokenizerSpec(
    added=QWEN3_ADDED,
    non_special=QWEN_NON_SPECIAL,
    first_added_id=QWEN_FIRST_ADDED_ID,
    word_tokens=QWEN_WORD_TOKENS,
    eos="<|im_end|>",
    pad="<|endoftext|>",
    template="qwen3.jinja",
    tokenizer_class="Qwen2Tokenizer",
)
LLAMA32_ADDED = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|python_tag|>",
        "<|finetune_right_pad_id|>",
]  # fmt: skip
LLAMA32 = TokenizerSpec(
    added=LLAMA32_ADDED,
    bos="<|begin_of_text|>",
    eos="<|eot_id|>",
    template="llama3_2.jinja",
)
GEMMA2 = TokenizerSpec(
    added=["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
    non_special={"<start_of_turn>", "<end_of_turn>"},
    bos="<bos>",
    eos="<eos>",
    pad="<pad>",
    unk="<unk>",
    template="gemma.jinja",
)
COHERE2_ADDED = [
        "<PAD>",
        "<UNK>",
        "<BOS_TOKEN>",
        "<EOS_TOKEN>",
        "<|START_OF_TURN_TOKEN|>",
        "<|END_OF_TURN_TOKEN|>",
        "<|USER_TOKEN|>",
        "<|CHATBOT_TOKEN|>",
        "<|SYSTEM_TOKEN|>",
        "<|START_RESPONSE|>",
        "<|END_RESPONSE|>",
        "<|START_THINKING|>",
        "<|END_THINKING|>",
        "<|START_ACTION|>",
        "<|END_ACTION|>",
        "<|START_TOOL_RESULT|>",
        "<|END_TOOL_RESULT|>",
]  # fmt: skip
COHERE2 = TokenizerSpec(
    added=COHERE2_ADDED,
    bos="<BOS_TOKEN>",
    eos="<|END_OF_TURN_TOKEN|>",
    pad="<PAD>",
    unk="<UNK>",
    template="cohere2.jinja",
)
GLM45_TEXT_TOKENS = [
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<arg_key>",
    "</arg_key>", "<arg_value>", "</arg_value>", "/nothink",
]  # fmt: skip
GLM45_ADDED = [
        "<|endoftext|>",
        "[MASK]",
        "[gMASK]",
        "[sMASK]",
        "<sop>",
        "<eop>",
        "<|system|>",
        "<|user|>",
        "<|assistant|>",
        "<|observation|>",
        "<|begin_of_image|>",
        "<|end_of_image|>",
        *GLM45_TEXT_TOKENS,
]  # fmt: skip
GLM45 = TokenizerSpec(
    added=GLM45_ADDED,
    non_special=set(GLM45_TEXT_TOKENS),
    eos="<|endoftext|>",
    pad="<|endoftext|>",
    template="glm4moe.jinja",
)
GPTOSS_ADDED = [
        "<|startoftext|>",
        "<|endoftext|>",
        "<|return|>",
        "<|constrain|>",
        "<|channel|>",
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|call|>",
]  # fmt: skip
GPTOSS = TokenizerSpec(
    added=GPTOSS_ADDED,
    bos="<|startoftext|>",
    eos="<|return|>",
    pad="<|endoftext|>",
    template="gptoss.jinja",
)
NEMOTRON3_TEXT_TOKENS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]
NEMOTRON3 = TokenizerSpec(
    added=["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", *NEMOTRON3_TEXT_TOKENS],
    non_special=set(NEMOTRON3_TEXT_TOKENS),
    bos="<s>",
    eos="<|im_end|>",
    pad="<unk>",
    unk="<unk>",
    template="nemotron_3_nano.jinja",
)


@dataclass
class StandIn:
    repo_id: str
    tokenizer: TokenizerSpec
    build_model: Callable  # (tokenizer) -> (model, generation_config or None)
    extra_files: dict[str, str] = field(default_factory=dict)
    config_overrides: dict = field(default_factory=dict)  # written into config.json after saving
    build_processor: Callable | None = None  # (tokenizer) -> processor (vision-language models)


def _seeded(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import torch

        state = torch.random.get_rng_state()
        torch.manual_seed(0)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.random.set_rng_state(state)

    return wrapper


def _ids(tokenizer, *tokens):
    return [tokenizer.convert_tokens_to_ids(t) for t in tokens]


# TRL's tiny models: two layers, 4 attention heads (2 key/value), MLP width 32; hidden size 8
# (16 for reward models).
TINY = dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, intermediate_size=32)


@_seeded
def _model(config_cls: str, model_cls: str, tok, generation: dict | None, fp32_params=(), **config_kwargs):
    """A bf16 model of ``model_cls`` (transformers) with its generation config."""
    import torch
    import transformers

    config = getattr(transformers, config_cls)(**config_kwargs)
    model = getattr(transformers, model_cls)(config).to(dtype=torch.bfloat16)
    for name in fp32_params:  # parameters the original keeps in fp32
        for pname, param in model.named_parameters():
            if pname.endswith(name):
                param.data = param.data.float()
    return model, (transformers.GenerationConfig(**generation) if generation is not None else None)


def _qwen_gen(tok, temperature=0.7, top_p=0.8, repetition_penalty=1.05):
    return dict(
        bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=_ids(tok, "<|im_end|>", "<|endoftext|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        do_sample=True,
        temperature=temperature,
        top_p=top_p,
        top_k=20,
        repetition_penalty=repetition_penalty,
    )


def _qwen_ids(tok):
    return dict(
        bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
    )


def qwen2_causal(tok):
    kwargs = dict(vocab_size=len(tok), hidden_size=8, **TINY, **_qwen_ids(tok))
    return _model("Qwen2Config", "Qwen2ForCausalLM", tok, _qwen_gen(tok), **kwargs)


def qwen2_seq_cls(tok):
    kwargs = dict(vocab_size=len(tok), hidden_size=16, num_labels=1, **TINY, **_qwen_ids(tok))
    return _model("Qwen2Config", "Qwen2ForSequenceClassification", tok, _qwen_gen(tok), **kwargs)


def qwen3_causal(tok):
    kwargs = dict(vocab_size=len(tok), hidden_size=8, **TINY, **_qwen_ids(tok))
    return _model("Qwen3Config", "Qwen3ForCausalLM", tok, _qwen_gen(tok, 0.6, 0.95, 1.0), **kwargs)


def qwen3_seq_cls(tok):
    kwargs = dict(vocab_size=len(tok), hidden_size=16, num_labels=1, **TINY, **_qwen_ids(tok))
    return _model(
        "Qwen3Config", "Qwen3ForSequenceClassification", tok, _qwen_gen(tok, 0.6, 0.95, 1.0), **kwargs
    )


def qwen3_moe_causal(tok):
    kwargs = dict(
        vocab_size=151936, hidden_size=8, **TINY, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
        head_dim=128, **_qwen_ids(tok),
    )  # fmt: skip
    return _model("Qwen3MoeConfig", "Qwen3MoeForCausalLM", tok, _qwen_gen(tok, 0.6, 0.95, 1.0), **kwargs)


def _llama_eos(tok):
    return _ids(tok, "<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")


def _llama_gen(tok):
    return dict(
        bos_token_id=tok.bos_token_id,
        eos_token_id=_llama_eos(tok),
        do_sample=True,
        temperature=0.6,
        top_p=0.9,
    )


def llama32_causal(tok):
    kwargs = dict(
        vocab_size=len(tok),
        hidden_size=8,
        **TINY,
        bos_token_id=tok.bos_token_id,
        eos_token_id=_llama_eos(tok),
    )
    return _model("LlamaConfig", "LlamaForCausalLM", tok, _llama_gen(tok), **kwargs)


def llama32_seq_cls(tok):
    kwargs = dict(
        vocab_size=len(tok), hidden_size=16, num_labels=1, **TINY, bos_token_id=tok.bos_token_id,
        eos_token_id=_llama_eos(tok),
    )  # fmt: skip
    return _model("LlamaConfig", "LlamaForSequenceClassification", tok, _llama_gen(tok), **kwargs)


def _special_ids(tok):
    return dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)


def gemma2_causal(tok):
    generation = {**_special_ids(tok), "eos_token_id": _ids(tok, "<eos>", "<end_of_turn>")}
    kwargs = dict(vocab_size=len(tok), hidden_size=8, **TINY, **_special_ids(tok))
    return _model("Gemma2Config", "Gemma2ForCausalLM", tok, generation, **kwargs)


def cohere2_causal(tok):
    generation = {**_special_ids(tok), "eos_token_id": _ids(tok, "<|END_OF_TURN_TOKEN|>", "<EOS_TOKEN>")}
    kwargs = dict(
        vocab_size=len(tok), hidden_size=8, **TINY, logit_scale=1.0, rope_theta=50000,
        **{**_special_ids(tok), "eos_token_id": tok.convert_tokens_to_ids("<EOS_TOKEN>")},
    )  # fmt: skip
    return _model("Cohere2Config", "Cohere2ForCausalLM", tok, generation, **kwargs)


def glm4_moe_causal(tok):
    eos = _ids(tok, "<|endoftext|>", "<|user|>", "<|observation|>")
    generation = dict(
        eos_token_id=eos, pad_token_id=tok.pad_token_id, temperature=0.6, top_p=0.95, do_sample=True
    )
    kwargs = dict(
        vocab_size=len(tok), hidden_size=8, **TINY, moe_intermediate_size=32, head_dim=2, n_routed_experts=4,
        num_experts_per_tok=2, attention_bias=True, eos_token_id=eos, pad_token_id=tok.pad_token_id,
        rope_theta=1000000, routed_scaling_factor=2.5, use_qk_norm=True, num_nextn_predict_layers=1,
    )  # fmt: skip
    return _model("Glm4MoeConfig", "Glm4MoeForCausalLM", tok, generation, **kwargs)


def gpt_oss_causal(tok):
    generation = {**_special_ids(tok), "eos_token_id": _ids(tok, "<|return|>", "<|call|>")}
    kwargs = dict(
        vocab_size=len(tok),
        hidden_size=8,
        **TINY,
        num_local_experts=4,
        num_experts_per_tok=2,
        **_special_ids(tok),
    )
    return _model("GptOssConfig", "GptOssForCausalLM", tok, generation, **kwargs)


def nemotron_h_causal(tok):
    generation = {**_special_ids(tok), "eos_token_id": _ids(tok, "<|im_end|>", "</s>")}
    kwargs = dict(
        vocab_size=len(tok), hidden_size=16, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=32, layers_block_type=["mamba", "attention", "moe"], mamba_num_heads=8,
        mamba_head_dim=4, mamba_n_groups=1, ssm_state_size=16, mamba_d_conv=4, mamba_expand=2,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=32, use_mamba_kernels=False, **_special_ids(tok),
    )  # fmt: skip
    fp32 = ("mixer.A_log", "mixer.D")
    return _model("NemotronHConfig", "NemotronHForCausalLM", tok, generation, fp32_params=fp32, **kwargs)


# A model that loads only through trust_remote_code: a LlamaForCausalLM subclass under model_type "remote"
# (TRL's tiny-RemoteForCausalLM is built the same way). Written into the snapshot as the repo's own code.
REMOTE_CONFIGURATION = """from transformers import LlamaConfig


class RemoteConfig(LlamaConfig):
    model_type = "remote"
"""
REMOTE_MODELING = """from transformers import LlamaForCausalLM, LlamaForSequenceClassification, LlamaModel

from .configuration_remote import RemoteConfig


class RemoteModel(LlamaModel):
    config_class = RemoteConfig


class RemoteForCausalLM(LlamaForCausalLM):
    config_class = RemoteConfig


class RemoteForSequenceClassification(LlamaForSequenceClassification):
    config_class = RemoteConfig
"""


# ----------------------------------------------------------------------------------------------------------
# Vision-language models (TRL's scripts/generate_tiny_models/for_conditional_generation/). Each TRL script
# loads the real model's config with
# AutoConfig.from_pretrained(MODEL_ID, text_config={...}, vision_config={...}),
# which *updates* the real sub-configs with the overrides (derived fields such as a sub-config's head_dim keep
# the real value). Here the real config is rebuilt from the fields below (the Hub config.json values as far as
# they matter for shapes; fields not listed take the transformers class defaults) and the script's overrides
# are applied the same way (_apply_overrides).

QWEN35_FIRST_ADDED_ID = (
    248044  # Qwen3.5/3.6: <|endoftext|> 248044 ... <|image_pad|> 248056, <tool_call> 248058
)
# Qwen3.5 ids hard-coded by test_train_with_tools_multimodal_response's fake generations. "I" (40), "!" (0),
# "<" (27), ">" (29), "\n" (198) are byte tokens. The split of "=screenshot_tool" over 13744/30091/22076 is
# a guess (the test only needs the three to decode to that text together).
QWEN35_WORD_TOKENS = {
    914: "'t",
    866: " any",
    1366: " know",
    1459: " don",
    1628: "function",
    5224: " tool",
    16936: "Done",
    13744: "=s",
    30091: "creenshot",
    22076: "_tool",
}
QWEN_VL_EXTRA = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>"}
QWEN25_VL = TokenizerSpec(
    added=QWEN25_ADDED,
    non_special=QWEN_NON_SPECIAL,
    first_added_id=QWEN_FIRST_ADDED_ID,
    word_tokens=QWEN_WORD_TOKENS,
    eos="<|im_end|>",
    pad="<|endoftext|>",
    template="qwen2_5_vl.jinja",  # TRL has no separate Qwen2-VL template; Qwen2-VL's is the same text
    tokenizer_class="Qwen2Tokenizer",
    model_max_length=32768,
)
QWEN35_EXTRA = {
    **QWEN_VL_EXTRA,
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
}
QWEN35_NOTHINK = TokenizerSpec(
    added=QWEN3_ADDED,
    non_special=QWEN_NON_SPECIAL,
    first_added_id=QWEN35_FIRST_ADDED_ID,
    word_tokens=QWEN35_WORD_TOKENS,
    eos="<|im_end|>",
    pad="<|endoftext|>",
    template="qwen3_5_nothink.jinja",
    tokenizer_class="Qwen2Tokenizer",
    model_max_length=262144,
    vocab_size=248320,
    extra_special=QWEN35_EXTRA,
)
QWEN36 = TokenizerSpec(
    added=QWEN3_ADDED,
    non_special=QWEN_NON_SPECIAL,
    first_added_id=QWEN35_FIRST_ADDED_ID,
    word_tokens=QWEN35_WORD_TOKENS,
    eos="<|im_end|>",
    pad="<|endoftext|>",
    template="qwen3_6.jinja",
    tokenizer_class="Qwen2Tokenizer",
    model_max_length=262144,
    vocab_size=248320,
    extra_special=QWEN35_EXTRA,
)
# Gemma 3 (gemma-3-4b-it): special tokens at their real ids in a 262,208-entry vocabulary.
GEMMA3 = TokenizerSpec(
    added=[],
    tokens_at={
        0: "<pad>",
        1: "<eos>",
        2: "<bos>",
        3: "<unk>",
        4: "<mask>",
        105: "<start_of_turn>",
        106: "<end_of_turn>",
        255999: "<start_of_image>",
        256000: "<end_of_image>",
        262144: "<image_soft_token>",
    },
    non_special={"<start_of_turn>", "<end_of_turn>"},
    vocab_size=262208,
    bos="<bos>",
    eos="<eos>",
    pad="<pad>",
    unk="<unk>",
    template="gemma3.jinja",
    tokenizer_class="TokenizersBackend",  # GemmaTokenizer would rebuild a SentencePiece-style pipeline
    extra_special={
        "boi_token": "<start_of_image>",
        "eoi_token": "<end_of_image>",
        "image_token": "<image_soft_token>",
    },
)
# Gemma 4 (gemma-4-E2B-it): the multimodal tokens at the ids of transformers' Gemma4Config defaults; the turn,
# tool, channel and think tokens' ids are not known here (<|turn> 105 and <turn|> 106 as in Gemma 3 are a
# guess; the others take the first free ids).
GEMMA4_TEXT_TOKENS = [
    "<|channel>",
    "<channel|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    "<|think|>",
]
GEMMA4 = TokenizerSpec(
    added=GEMMA4_TEXT_TOKENS,
    tokens_at={
        0: "<pad>",
        1: "<eos>",
        2: "<bos>",
        3: "<unk>",
        4: "<mask>",
        105: "<|turn>",
        106: "<turn|>",
        255999: "<|image>",
        256000: "<|audio>",
        258880: "<|image|>",
        258881: "<|audio|>",
        258882: "<image|>",
        258883: "<audio|>",
        258884: "<|video|>",
    },
    non_special={"<|turn>", "<turn|>", *GEMMA4_TEXT_TOKENS},
    vocab_size=262144,
    bos="<bos>",
    eos="<eos>",
    pad="<pad>",
    unk="<unk>",
    template="gemma4_v5.jinja",  # the newest of TRL's Gemma 4 templates (the tiny model's: a guess)
    tokenizer_class="TokenizersBackend",  # GemmaTokenizer would rebuild a SentencePiece-style pipeline
    extra_special={
        "boi_token": "<|image>",
        "eoi_token": "<image|>",
        "image_token": "<|image|>",
        "boa_token": "<|audio>",
        "eoa_token": "<audio|>",
        "audio_token": "<|audio|>",
        "video_token": "<|video|>",
    },
)
# LLaVA-NeXT (llava-v1.6-mistral-7b-hf): Mistral's <unk>/<s>/</s> at 0-2, <image> 32000, <pad> 32001;
# 32064 ids.
LLAVA_NEXT = TokenizerSpec(
    added=[],
    tokens_at={0: "<unk>", 1: "<s>", 2: "</s>", 32000: "<image>", 32001: "<pad>"},
    vocab_size=32064,
    bos="<s>",
    eos="</s>",
    pad="<pad>",
    unk="<unk>",
    template="llava_next.jinja",
    tokenizer_class="TokenizersBackend",  # LlamaTokenizer would rebuild a SentencePiece-style pipeline
    model_max_length=32768,
    extra_special={"image_token": "<image>"},
)


def _apply_overrides(config, overrides: dict) -> None:
    """As AutoConfig.from_pretrained(..., **overrides): a dict for a sub-config updates that sub-config."""
    from transformers import PreTrainedConfig

    for key, value in overrides.items():
        current = getattr(config, key, None)
        if isinstance(current, PreTrainedConfig) and isinstance(value, dict):
            value = current.__class__(**{**current.to_dict(), **value})
        setattr(config, key, value)


@_seeded
def _vlm(
    config_cls: str, model_cls: str, real: dict, overrides: dict, generation: dict | None, fp32_params=()
):
    import torch
    import transformers

    config = getattr(transformers, config_cls)(**real)
    _apply_overrides(config, overrides)
    model = getattr(transformers, model_cls)(config).to(dtype=torch.bfloat16)
    for name in fp32_params:
        for pname, param in model.named_parameters():
            if pname.endswith(name):
                param.data = param.data.float()
    return model, (transformers.GenerationConfig(**generation) if generation is not None else None)


def _qwen_vl_gen(tok, temperature=0.01, top_p=0.001, top_k=1, repetition_penalty=1.05):
    return {**_qwen_gen(tok, temperature, top_p, repetition_penalty), "top_k": top_k, "pad_token_id": 151643}


QWEN_VL_IDS = dict(
    image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653
)
QWEN_VL_TINY_TEXT = {
    "num_hidden_layers": 2,
    "hidden_size": 16,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "layer_types": None,
    "rope_scaling": {"type": "default", "mrope_section": [1, 1], "rope_type": "default"},
}


def qwen2_5_vl(tok):
    # Qwen/Qwen2.5-VL-3B-Instruct
    real = dict(
        text_config=dict(
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=11008,
            num_hidden_layers=36,
            num_attention_heads=16,
            num_key_value_heads=2,
            max_position_embeddings=128000,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            sliding_window=32768,
            max_window_layers=70,
            use_sliding_window=False,
            tie_word_embeddings=True,
            bos_token_id=151643,
            eos_token_id=151645,
            rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24], "rope_type": "default"},
        ),
        vision_config=dict(
            depth=32,
            hidden_size=1280,
            intermediate_size=3420,
            num_heads=16,
            out_hidden_size=2048,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=112,
            fullatt_block_indexes=[7, 15, 23, 31],
            tokens_per_second=2,
            hidden_act="silu",
            in_chans=3,
        ),
        tie_word_embeddings=True,
        **QWEN_VL_IDS,
    )
    overrides = dict(
        text_config=QWEN_VL_TINY_TEXT,
        vision_config={
            "hidden_size": 16,
            "num_heads": 4,
            "depth": 2,
            "fullatt_block_indexes": [1],
            "out_hidden_size": 16,
        },
        rope_scaling={"type": "default", "mrope_section": [1, 1], "rope_type": "default"},
        num_hidden_layers=2,
        hidden_size=16,
        num_attention_heads=4,
    )
    generation = _qwen_vl_gen(tok)  # Qwen2-VL/2.5-VL Instruct: near-greedy sampling (values from memory)
    return _vlm("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", real, overrides, generation)


def qwen2_vl(tok):
    # Qwen/Qwen2-VL-2B-Instruct
    real = dict(
        text_config=dict(
            vocab_size=151936,
            hidden_size=1536,
            intermediate_size=8960,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            sliding_window=32768,
            max_window_layers=28,
            use_sliding_window=False,
            tie_word_embeddings=True,
            bos_token_id=151643,
            eos_token_id=151645,
            rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24], "rope_type": "default"},
        ),
        vision_config=dict(
            depth=32,
            embed_dim=1280,
            hidden_size=1536,
            mlp_ratio=4,
            num_heads=16,
            in_channels=3,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            hidden_act="quick_gelu",
        ),
        tie_word_embeddings=True,
        **QWEN_VL_IDS,
    )
    overrides = dict(
        text_config=QWEN_VL_TINY_TEXT,
        vision_config={"hidden_size": 16, "num_heads": 4, "embed_dim": 64, "depth": 2},
        rope_scaling={"type": "default", "mrope_section": [1, 1], "rope_type": "default"},
    )
    generation = _qwen_vl_gen(tok)
    return _vlm("Qwen2VLConfig", "Qwen2VLForConditionalGeneration", real, overrides, generation)


QWEN35_IDS = dict(
    image_token_id=248056, video_token_id=248057, vision_start_token_id=248053, vision_end_token_id=248054
)
QWEN35_TINY_TEXT = {
    "num_hidden_layers": 2,
    "hidden_size": 16,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "layer_types": ["linear_attention", "full_attention"],
    "full_attention_interval": 2,
}
QWEN35_TINY_VISION = {
    "hidden_size": 16,
    "depth": 2,
    "num_heads": 4,
    "intermediate_size": 32,
    "out_hidden_size": 16,
}


def qwen3_5_nothink(tok):
    # Qwen/Qwen3.5-0.8B (text: 24 layers of 3 linear-attention + 1 full-attention, hidden 1024)
    real = dict(
        text_config=dict(
            vocab_size=248320,
            hidden_size=1024,
            intermediate_size=3584,
            num_hidden_layers=24,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=256,
            linear_num_value_heads=16,
            linear_num_key_heads=16,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            linear_conv_kernel_dim=4,
            full_attention_interval=4,
            max_position_embeddings=262144,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            eos_token_id=248044,
        ),
        vision_config=dict(
            depth=12,
            hidden_size=768,
            intermediate_size=3072,
            num_heads=12,
            out_hidden_size=1024,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            num_position_embeddings=2304,
        ),
        tie_word_embeddings=True,
        **QWEN35_IDS,
    )
    overrides = dict(text_config=QWEN35_TINY_TEXT, vision_config=QWEN35_TINY_VISION)
    # TRL pushes this one without a generation config; A_log and the linear-attention norm stay fp32
    fp32 = ("linear_attn.A_log", "linear_attn.norm.weight")
    return _vlm("Qwen3_5Config", "Qwen3_5ForConditionalGeneration", real, overrides, None, fp32_params=fp32)


def qwen3_6_moe(tok):
    # Qwen/Qwen3.6-35B-A3B (text: 40 layers, hidden 2048, 256 experts, 8 per token)
    real = dict(
        text_config=dict(
            vocab_size=248320,
            hidden_size=2048,
            num_hidden_layers=40,
            num_attention_heads=16,
            num_key_value_heads=2,
            head_dim=256,
            linear_num_value_heads=32,
            linear_num_key_heads=16,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            linear_conv_kernel_dim=4,
            full_attention_interval=4,
            num_experts=256,
            num_experts_per_tok=8,
            moe_intermediate_size=512,
            shared_expert_intermediate_size=512,
            max_position_embeddings=262144,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            eos_token_id=248046,
        ),
        vision_config=dict(
            depth=27,
            hidden_size=1152,
            intermediate_size=4304,
            num_heads=16,
            out_hidden_size=2048,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            num_position_embeddings=2304,
        ),
        tie_word_embeddings=False,
        **QWEN35_IDS,
    )
    overrides = dict(
        text_config={
            **QWEN35_TINY_TEXT,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
        },
        vision_config=QWEN35_TINY_VISION,
    )
    generation = dict(
        bos_token_id=248044,
        eos_token_id=[248046, 248044],
        pad_token_id=248044,
        do_sample=True,
        temperature=1.0,
        top_p=0.95,
        top_k=20,
    )
    return _vlm("Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration", real, overrides, generation)


def gemma3_vlm(tok):
    # google/gemma-3-4b-it
    real = dict(
        text_config=dict(
            vocab_size=262208,
            hidden_size=2560,
            intermediate_size=10240,
            num_hidden_layers=34,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            query_pre_attn_scalar=256,
            sliding_window=1024,
            rope_scaling={"factor": 8.0, "rope_type": "linear"},
            max_position_embeddings=131072,
        ),
        vision_config=dict(
            hidden_size=1152,
            image_size=896,
            intermediate_size=4304,
            num_attention_heads=16,
            num_hidden_layers=27,
            patch_size=14,
            vision_use_head=False,
        ),
        mm_tokens_per_image=256,
        boi_token_index=255999,
        eoi_token_index=256000,
        image_token_index=262144,
        eos_token_id=[1, 106],
    )
    overrides = dict(
        text_config={
            "num_hidden_layers": 2,
            "hidden_size": 16,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "layer_types": None,
            "intermediate_size": 32,
        },
        vision_config={
            "num_hidden_layers": 2,
            "hidden_size": 16,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "embed_dim": 64,
            "intermediate_size": 32,
            "image_size": 224,
        },
    )
    generation = dict(
        bos_token_id=2, eos_token_id=[1, 106], pad_token_id=0, do_sample=True, top_k=64, top_p=0.95
    )
    return _vlm("Gemma3Config", "Gemma3ForConditionalGeneration", real, overrides, generation)


GEMMA4_IMAGE_TOKENS = 70  # TRL's script: the minimum supported max_soft_tokens


@_seeded
def gemma4_vlm(tok):
    # google/gemma-4-E2B-it; TRL's script sets the overrides with setattr on the loaded sub-configs.
    # The real E2B fields below are from memory where they matter for shapes (head_dim 256, per-layer inputs);
    # everything else is transformers' Gemma4 class defaults (a guess where the Hub config differs).
    import torch
    import transformers

    text = {
        "num_hidden_layers": 2,
        "hidden_size": 16,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 32,
        "layer_types": ["sliding_attention", "full_attention"],
        "num_kv_shared_layers": 0,
        "global_head_dim": 8,
        "hidden_size_per_layer_input": 16,
    }
    vision = {
        "num_hidden_layers": 2,
        "hidden_size": 16,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "embed_dim": 64,
        "intermediate_size": 32,
        "position_embedding_size": GEMMA4_IMAGE_TOKENS * 3**2,
        "default_output_length": GEMMA4_IMAGE_TOKENS,
    }
    # Built in one go (setting num_hidden_layers/layer_types after construction, as the script does on the Hub
    # config, leaves a per-layer head_dim table for 35 layers that transformers 5.25 rejects on reload).
    config = transformers.Gemma4Config(
        text_config=dict(vocab_size=262144, head_dim=256, **text), vision_config=vision, audio_config=None
    )
    model = transformers.Gemma4ForConditionalGeneration(config).to(dtype=torch.bfloat16)
    generation = transformers.GenerationConfig(
        bos_token_id=2,
        eos_token_id=[1, 106],
        pad_token_id=0,
        do_sample=True,
        temperature=1.0,
        top_k=64,
        top_p=0.95,
    )
    return model, generation


def llava_next_vlm(tok):
    # llava-hf/llava-v1.6-mistral-7b-hf
    real = dict(
        text_config=dict(
            model_type="mistral",
            vocab_size=32064,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=32768,
            rms_norm_eps=1e-5,
            rope_theta=1000000.0,
            sliding_window=None,
            dtype="bfloat16",
        ),
        vision_config=dict(
            model_type="clip_vision_model",
            hidden_size=1024,
            intermediate_size=4096,
            num_hidden_layers=24,
            num_attention_heads=16,
            image_size=336,
            patch_size=14,
            projection_dim=768,
            vocab_size=32000,
        ),
        image_grid_pinpoints=[[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
        image_token_index=32000,
        pad_token_id=32001,
        tie_word_embeddings=False,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
    )
    overrides = dict(
        text_config={
            "num_hidden_layers": 2,
            "hidden_size": 16,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "layer_types": None,
            "dtype": None,
        },
        vision_config={"num_hidden_layers": 2, "hidden_size": 16, "num_attention_heads": 4},
    )
    generation = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return _vlm("LlavaNextConfig", "LlavaNextForConditionalGeneration", real, overrides, generation)


# Processors: the architecture's processor class with the real image/video processor settings (Hub
# preprocessor_config.json values as far as known; transformers' defaults otherwise).
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


def _chat_template(tok) -> str:
    return tok.chat_template


def qwen2_vl_processor(processor_cls: str):
    def build(tok):
        import transformers

        image = transformers.Qwen2VLImageProcessor(
            min_pixels=3136,
            max_pixels=12845056,
            patch_size=14,
            merge_size=2,
            temporal_patch_size=2,
            image_mean=CLIP_MEAN,
            image_std=CLIP_STD,
        )
        video = transformers.Qwen2VLVideoProcessor(
            min_pixels=3136,
            max_pixels=12845056,
            patch_size=14,
            merge_size=2,
            temporal_patch_size=2,
            image_mean=CLIP_MEAN,
            image_std=CLIP_STD,
        )
        return getattr(transformers, processor_cls)(
            image_processor=image, tokenizer=tok, video_processor=video, chat_template=_chat_template(tok)
        )

    return build


def qwen3_5_processor(tok):
    import transformers

    size = {"shortest_edge": 65536, "longest_edge": 16777216}
    image = transformers.Qwen2VLImageProcessor(
        size=size,
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )
    video = transformers.Qwen3VLVideoProcessor(
        size={"shortest_edge": 4096, "longest_edge": 25165824},
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )
    return transformers.Qwen3VLProcessor(
        image_processor=image, tokenizer=tok, video_processor=video, chat_template=_chat_template(tok)
    )


def gemma3_processor(tok):
    import transformers

    image = transformers.Gemma3ImageProcessor(
        size={"height": 224, "width": 224}, image_mean=[0.5] * 3, image_std=[0.5] * 3, do_pan_and_scan=False
    )  # TRL's script sets size 224x224 (the real one: 896x896)
    return transformers.Gemma3Processor(
        image_processor=image, tokenizer=tok, chat_template=_chat_template(tok), image_seq_length=256
    )


def gemma4_processor(tok):
    import transformers

    image = transformers.Gemma4ImageProcessor(max_soft_tokens=GEMMA4_IMAGE_TOKENS)
    image.image_seq_length = GEMMA4_IMAGE_TOKENS
    return transformers.Gemma4Processor(
        feature_extractor=transformers.Gemma4AudioFeatureExtractor(),
        image_processor=image,
        tokenizer=tok,
        video_processor=transformers.Gemma4VideoProcessor(),
        chat_template=_chat_template(tok),
        image_seq_length=GEMMA4_IMAGE_TOKENS,
    )


def llava_next_processor(tok):
    import transformers

    image = transformers.LlavaNextImageProcessor(
        size={"shortest_edge": 336},
        crop_size={"height": 336, "width": 336},
        image_grid_pinpoints=[[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
        image_mean=CLIP_MEAN,
        image_std=CLIP_STD,
        do_pad=True,
    )
    return transformers.LlavaNextProcessor(
        image_processor=image,
        tokenizer=tok,
        patch_size=14,
        vision_feature_select_strategy="default",
        chat_template=_chat_template(tok),
        num_additional_image_tokens=1,
    )


VLM_STANDINS = [
    StandIn(f"{ORG}/tiny-Qwen2_5_VLForConditionalGeneration", QWEN25_VL, qwen2_5_vl,
            build_processor=qwen2_vl_processor("Qwen2_5_VLProcessor")),
    StandIn(f"{ORG}/tiny-Qwen2VLForConditionalGeneration", QWEN25_VL, qwen2_vl,
            build_processor=qwen2_vl_processor("Qwen2VLProcessor")),
    StandIn(f"{ORG}/tiny-Qwen3_5ForConditionalGeneration-NoThink", QWEN35_NOTHINK, qwen3_5_nothink,
            build_processor=qwen3_5_processor),
    StandIn(f"{ORG}/tiny-Qwen3_5MoeForConditionalGeneration-3.6", QWEN36, qwen3_6_moe,
            build_processor=qwen3_5_processor),
    StandIn(
        f"{ORG}/tiny-Gemma3ForConditionalGeneration", GEMMA3, gemma3_vlm, build_processor=gemma3_processor
    ),
    StandIn(
        f"{ORG}/tiny-Gemma4ForConditionalGeneration", GEMMA4, gemma4_vlm, build_processor=gemma4_processor
    ),
    StandIn(f"{ORG}/tiny-LlavaNextForConditionalGeneration", LLAVA_NEXT, llava_next_vlm,
            build_processor=llava_next_processor),
]  # fmt: skip

STANDINS = [
    StandIn(f"{ORG}/tiny-Qwen2ForCausalLM-2.5", QWEN25, qwen2_causal),
    StandIn(f"{ORG}/tiny-Qwen2ForSequenceClassification-2.5", QWEN25, qwen2_seq_cls),
    StandIn(f"{ORG}/tiny-Qwen3ForCausalLM", QWEN3, qwen3_causal),
    StandIn(f"{ORG}/tiny-Qwen3ForSequenceClassification", QWEN3, qwen3_seq_cls),
    StandIn(f"{ORG}/tiny-Qwen3MoeForCausalLM", QWEN3, qwen3_moe_causal),
    StandIn(f"{ORG}/tiny-LlamaForCausalLM-3.2", LLAMA32, llama32_causal),
    StandIn(f"{ORG}/tiny-LlamaForSequenceClassification-3.2", LLAMA32, llama32_seq_cls),
    StandIn(f"{ORG}/tiny-Gemma2ForCausalLM", GEMMA2, gemma2_causal),
    StandIn(f"{ORG}/tiny-Cohere2ForCausalLM", COHERE2, cohere2_causal),
    StandIn(f"{ORG}/tiny-Glm4MoeForCausalLM", GLM45, glm4_moe_causal),
    StandIn(f"{ORG}/tiny-GptOssForCausalLM", GPTOSS, gpt_oss_causal),
    StandIn(f"{ORG}/tiny-NemotronHForCausalLM-nano", NEMOTRON3, nemotron_h_causal),
    StandIn(
        f"{ORG}/tiny-RemoteForCausalLM",
        LLAMA32,
        llama32_causal,
        extra_files={"configuration_remote.py": REMOTE_CONFIGURATION, "modeling_remote.py": REMOTE_MODELING},
        config_overrides={
            "model_type": "remote",
            "architectures": ["RemoteForCausalLM"],
            "auto_map": {
                "AutoConfig": "configuration_remote.RemoteConfig",
                "AutoModel": "modeling_remote.RemoteModel",
                "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM",
                "AutoModelForSequenceClassification": "modeling_remote.RemoteForSequenceClassification",
            },
        },
    ),
    *VLM_STANDINS,
]

# Data: the prompts of TRL's "zen" data set (scripts/generate_zen_dataset.py), the two configs the GRPO
# tests load.
ZEN_STANDARD_PROMPTS = [
    "Beautiful is better than", "Explicit is", "Simple is better", "Complex", "Flat is better than",
    "Sparse is better", "Readability", "Special cases aren't special", "Although practicality beats",
    "Errors should never", "Unless explicitly", "In the face of ambiguity, refuse",
    "There should be one-- and preferably", "Although that way may not be obvious at first unless you're",
    "Now is", "Although never is often", "If the implementation is hard to explain,",
    "If the implementation is easy", "Namespaces are one honking great",
]  # fmt: skip
ZEN_CONVERSATIONAL_QUESTIONS = [
    "What is better than ugly?", "What is better than implicit?", "What is better than complex?",
    "What is better than complicated?", "What is better than nested?", "What is better than dense?",
    "What counts?", "Are special cases enough to break the rules?", "What beats purity?",
    "What should never pass silently?", "When can errors pass silently?",
    "What should you do in the face of ambiguity?", "How many ways should there be to do it?",
    "For whom may the way not be obvious at first?", "What is better than never?",
    "Is never better than *right* now?", "What does it mean if the implementation is hard to explain?",
    "What does it mean if the implementation is easy to explain?", "Any great ideas?",
]  # fmt: skip
ZEN_CONFIGS = {
    "standard_prompt_only": {"prompt": ZEN_STANDARD_PROMPTS},
    "conversational_prompt_only": {
        "prompt": [[{"role": "user", "content": q}] for q in ZEN_CONVERSATIONAL_QUESTIONS]
    },
}


# zen-image / zen-multi-image (TRL's scripts/generate_zen_image_dataset.py and
# generate_zen_multi_image_dataset.py):
# the same 19 questions with random uint8 RGB images of random sizes 32-63 (np.random.randint(32, 64)), drawn
# config by config in the scripts' order. TRL's scripts do not seed numpy; here np.random.seed(ZEN_IMAGE_SEED)
# before each data set, so the images are fixed but not TRL's pixels.
ZEN_IMAGE_SEED = 0
ZEN_ANSWERS = [
    "Beautiful.", "Explicit.", "Simple.", "Complex.", "Flat.", "Sparse.", "Readability.",
    "No, special cases aren't special enough to break the rules.", "Practicality.", "Errors.",
    "When explicitly silenced.", "Refuse the temptation to guess.", "One, and preferably only one.", "Dutch.",
    "Now is better than never.", "Yes, often.", "It means it's a bad idea.",
    "It means it may be a good idea.",
    "Namespaces are one honking great idea.",
]  # fmt: skip
# zen-multi-image's user turns: None is an image, a string a text part (the script's layouts, row by row).
Q = ZEN_CONVERSATIONAL_QUESTIONS
ZEN_MULTI_IMAGE_LAYOUTS = [
    [None, Q[0]], [Q[1], None], [None, Q[2], None], [None, None, Q[3]], [None, Q[4]], [Q[5], None],
    [None, Q[6], None], [Q[7]], [Q[8], None, None], [None, None, Q[9], None], [None, Q[10]], [Q[11], None],
    [None, Q[12], None, None], [Q[13]], [Q[14], None], ["Is", None, " never better than *right* now?"],
    [None, Q[16]], [Q[17], None], [Q[18]],
]  # fmt: skip
del Q


def _random_images(rng, n: int):
    sizes = rng.randint(32, 64, size=(n, 2))
    return [rng.uniform(low=0.0, high=255.0, size=(h, w, 3)).astype("uint8") for h, w in sizes]


def _zen_image_configs() -> dict:
    import numpy as np
    from datasets import Dataset, Features, Image, Value

    rng = np.random.RandomState(ZEN_IMAGE_SEED)
    message = [{"content": Value("string"), "role": Value("string")}]
    qs = ZEN_CONVERSATIONAL_QUESTIONS
    lm = {
        "messages": [
            [{"role": "user", "content": q}, {"role": "assistant", "content": answer}]
            for q, answer in zip(qs, ZEN_ANSWERS)
        ],
        "image": _random_images(rng, len(qs)),
    }  # fmt: skip
    prompt_only = {
        "prompt": [[{"role": "user", "content": q}] for q in qs],
        "image": _random_images(rng, len(qs)),
    }
    return {
        "conversational_language_modeling": Dataset.from_dict(
            lm, features=Features(messages=message, image=Image())
        ),
        "conversational_prompt_only": Dataset.from_dict(
            prompt_only, features=Features(prompt=message, image=Image())
        ),
    }


def _zen_multi_image_configs() -> dict:
    import numpy as np
    from datasets import Dataset, Features, Image, List, Value

    rng = np.random.RandomState(ZEN_IMAGE_SEED)
    message = List(
        {"content": List({"text": Value("string"), "type": Value("string")}), "role": Value("string")}
    )

    def user(layout):
        parts = [{"type": "image"} if p is None else {"type": "text", "text": p} for p in layout]
        return {"role": "user", "content": parts}

    def images():
        return [_random_images(rng, sum(p is None for p in layout)) for layout in ZEN_MULTI_IMAGE_LAYOUTS]

    lm = [
        [user(layout), {"role": "assistant", "content": [{"type": "text", "text": a}]}]
        for layout, a in zip(ZEN_MULTI_IMAGE_LAYOUTS, ZEN_ANSWERS)
    ]
    prompt = [[user(layout)] for layout in ZEN_MULTI_IMAGE_LAYOUTS]
    lm_images = images()  # drawn first, as in the script
    return {
        "conversational_language_modeling": Dataset.from_dict(
            {"messages": lm, "images": lm_images}, features=Features(messages=message, images=List(Image()))
        ),
        "conversational_prompt_only": Dataset.from_dict(
            {"prompt": prompt, "images": images()}, features=Features(prompt=message, images=List(Image()))
        ),
    }


def _zen_text_configs() -> dict:
    from datasets import Dataset

    return {name: Dataset.from_dict(columns) for name, columns in ZEN_CONFIGS.items()}


# data set name -> configs builder; each config is split 90/10 train/test without shuffling, as TRL's do
DATASETS = {
    "zen": _zen_text_configs,
    "zen-image": _zen_image_configs,
    "zen-multi-image": _zen_multi_image_configs,
}


def _snapshot_hash(name: str) -> str:
    return hashlib.sha1(f"grpokit-standin:{STANDIN_VERSION}:{name}".encode()).hexdigest()


def hub_snapshot_dir(hf_home: Path, repo_id: str, repo_type: str = "model") -> Path:
    org, name = repo_id.split("/")
    return hf_home / "hub" / f"{repo_type}s--{org}--{name}" / "snapshots" / _snapshot_hash(repo_id)


def is_model_built(hf_home: Path, repo_id: str) -> bool:
    org, name = repo_id.split("/")
    ref = hf_home / "hub" / f"models--{org}--{name}" / "refs" / "main"
    return (
        ref.is_file()
        and (ref.parent.parent / "snapshots" / ref.read_text().strip() / "config.json").is_file()
    )


def dataset_cache_dir(hf_home: Path, repo_id: str) -> Path:
    org, name = repo_id.split("/")
    return hf_home / "datasets" / f"{org}___{name}"


def is_dataset_built(hf_home: Path, repo_id: str) -> bool:
    return any(dataset_cache_dir(hf_home, repo_id).glob("*/*/*/dataset_info.json"))


def _write_model(hf_home: Path, standin: StandIn, tokenizer) -> None:
    snapshot = hub_snapshot_dir(hf_home, standin.repo_id)
    repo_root = snapshot.parent.parent
    if repo_root.exists():
        shutil.rmtree(repo_root)
    snapshot.mkdir(parents=True)
    model, generation_config = standin.build_model(tokenizer)
    model.save_pretrained(snapshot)
    if generation_config is not None:
        generation_config.save_pretrained(snapshot)
    if standin.build_processor is not None:
        standin.build_processor(tokenizer).save_pretrained(
            snapshot
        )  # tokenizer, image/video processor, template
    save_tokenizer(tokenizer, standin.tokenizer, snapshot)
    for name, text in standin.extra_files.items():
        (snapshot / name).write_text(text)
    if standin.config_overrides:
        config_path = snapshot / "config.json"
        config = json.loads(config_path.read_text())
        config.update(standin.config_overrides)
        config_path.write_text(json.dumps(config, indent=2) + "\n")
    (repo_root / "refs").mkdir()
    (repo_root / "refs" / "main").write_text(snapshot.name)


def _write_dataset(hf_home: Path, name: str) -> list[str]:
    """A data set's configs in the datasets cache, prepared from local parquet files under the repo's name."""
    from datasets import load_dataset

    target = dataset_cache_dir(hf_home, f"{ORG}/{name}")
    if target.exists():
        shutil.rmtree(target)
    configs = DATASETS[name]()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / name  # the cache directory is named after this folder, then renamed below
        cache = Path(tmp) / "cache"
        readme = ["---", "configs:"]
        for config_name, dataset in configs.items():
            splits = dataset.train_test_split(test_size=0.1, shuffle=False)
            (src / config_name).mkdir(parents=True)
            readme += [f"- config_name: {config_name}", "  data_files:"]
            for split, ds in splits.items():
                ds.to_parquet(str(src / config_name / f"{split}-00000-of-00001.parquet"))
                readme += [f"  - split: {split}", f"    path: {config_name}/{split}-*"]
        (src / "README.md").write_text("\n".join([*readme, "---", ""]))
        for config_name in configs:
            load_dataset(str(src), config_name, cache_dir=str(cache))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(cache / name, target, ignore=shutil.ignore_patterns("*.lock"))
    return list(configs)


def _check_vlm(standin: StandIn, tok) -> str:
    """A vision-language stand-in: its processor expands an image chat and the model runs on the result."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(standin.repo_id)
    for i, token in standin.tokenizer.tokens_at.items():
        assert tok.convert_tokens_to_ids(token) == i, (
            standin.repo_id,
            token,
            tok.convert_tokens_to_ids(token),
            i,
        )
    image = Image.new("RGB", (40, 52), color="red")
    messages = [
        [
            {
                "role": "user",
                "content": [{"type": "image", "image": image}, {"type": "text", "text": "What is this?"}],
            }
        ],
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Is it blue?"}, {"type": "image", "image": image}],
            }
        ],
    ]
    inputs = processor.apply_chat_template(
        messages,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        padding=True,
    )
    model = AutoModelForImageTextToText.from_pretrained(standin.repo_id)
    # the processor expands the image into the model's image token (at the family's real id)
    assert (inputs["input_ids"] == model.config.image_token_id).sum() >= 2, standin.repo_id
    with torch.no_grad():
        out = model(**inputs)
    assert not torch.isnan(out.logits.float()).any(), standin.repo_id
    return f"{type(processor).__name__}, {inputs['input_ids'].shape[1]} tokens for one image"


def _check(hf_home: Path) -> None:
    """Load every stand-in the way the tests do (offline, by hub id) and check the tokenizers round-trip."""
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    vlm = torchvision_available()
    for standin in STANDINS:
        if standin.build_processor is not None and not vlm:
            print(f"--  {standin.repo_id}: not checked (its processor needs torchvision)")
            continue
        kwargs = {"trust_remote_code": True} if standin.extra_files else {}
        tok = AutoTokenizer.from_pretrained(standin.repo_id, **kwargs)
        text = "Hello, world! 3 + 4 = 7\n  done."
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text, (standin.repo_id, tok.decode(ids))
        assert tok.chat_template == _trl_chat_template(standin.tokenizer.template), standin.repo_id
        if standin.tokenizer.word_tokens:
            for i, word in standin.tokenizer.word_tokens.items():
                assert tok.decode([i]) == word, (standin.repo_id, i, tok.decode([i]), word)
        if standin.build_processor is not None:
            detail = _check_vlm(standin, tok)
            print(f"ok  {standin.repo_id:62s} vocab {len(tok)} ({type(tok).__name__}); {detail}")
            continue
        auto = (
            AutoModelForSequenceClassification
            if "SequenceClassification" in standin.repo_id
            else AutoModelForCausalLM
        )
        model = auto.from_pretrained(standin.repo_id, **kwargs)
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids[:8]]))
        assert not torch.isnan(out.logits.float()).any(), standin.repo_id
        print(f"ok  {standin.repo_id:62s} {type(model).__name__:36s} vocab {len(tok)} ({type(tok).__name__})")
    for name, configs in DATASETS.items():
        for config_name in configs():
            dd = load_dataset(f"{ORG}/{name}", config_name)
            print(f"ok  {ORG}/{name} {config_name}: " + ", ".join(f"{k} {len(v)}" for k, v in dd.items()))


def torchvision_available() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # absent, or built for another torch
        return False
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--hf-home", type=Path, default=Path(os.environ.get("STANDINS_HF_HOME", DEFAULT_HF_HOME))
    )
    parser.add_argument("--force", action="store_true", help="rebuild everything")
    parser.add_argument("--check", action="store_true", help="load every stand-in offline after building")
    args = parser.parse_args(argv)
    hf_home = args.hf_home.resolve()
    # Before transformers/datasets are imported: they read these at import time.
    os.environ["HF_HOME"] = str(hf_home)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    # The vision-language stand-ins are built only where torchvision imports (their processors need it; it
    # does not import beside the CPU torch 2.13.0 of the default run): the default run skips those tests as
    # "stand-in not built", a torchvision environment (README.md) builds them.
    vlm = torchvision_available()
    marker = hf_home / f".standins-v{STANDIN_VERSION}{'-vlm' if vlm else ''}"
    done = marker.exists() or (not vlm and marker.with_name(marker.name + "-vlm").exists())
    if done and not args.force:
        print(f"stand-ins already built in {hf_home} (--force to rebuild)")
    else:
        if marker.exists():
            marker.unlink()
        standins = [s for s in STANDINS if vlm or s.build_processor is None]
        if not vlm:
            print("torchvision does not import here: the vision-language stand-ins are not built")
        tokenizers: dict[int, object] = {}
        for standin in standins:
            key = id(standin.tokenizer)
            if key not in tokenizers:
                tokenizers[key] = build_tokenizer(standin.tokenizer)
            _write_model(hf_home, standin, tokenizers[key])
            print(f"built {standin.repo_id}")
        for name in DATASETS:
            configs = _write_dataset(hf_home, name)
            print(f"built {ORG}/{name} ({', '.join(configs)})")
        marker.write_text(
            "\n".join([*(s.repo_id for s in standins), *(f"{ORG}/{n}" for n in DATASETS)]) + "\n"
        )
    if args.check:
        _check(hf_home)
    return 0


if __name__ == "__main__":
    sys.exit(main())
