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
* Weights are random (seeded), not TRL's; no model card. Vision-language models and TRL's GPU-only models
  are not built (the tests that need them are reported as "stand-in not built").
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
STANDIN_VERSION = "2"
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

    vocab: dict[str, int] = {tok: i for i, tok in enumerate(_byte_token_order())}
    for i, text in spec.word_tokens.items():
        vocab[_byte_level(text)] = i
    new_tokens, merges = _learned_merges()
    first_added = spec.first_added_id if spec.first_added_id is not None else len(vocab) + len(new_tokens)
    used = set(vocab.values())
    free = (i for i in range(len(_byte_token_order()), first_added) if i not in used)
    for token in new_tokens:
        if token not in vocab:
            vocab[token] = next(free)
    for i in free:
        vocab[f"t{i}"] = i  # placeholder: decodes to the text "t<id>"
    for k, tok in enumerate(spec.added):
        vocab[tok] = first_added + k
    assert len(set(vocab.values())) == len(vocab) == max(vocab.values()) + 1, "ids must be 0..n-1, unique"

    backend = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = _pre_tokenizer()
    backend.decoder = decoders.ByteLevel()
    backend.add_tokens(
        [AddedToken(tok, special=tok not in spec.non_special, normalized=False) for tok in spec.added]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=spec.bos,
        eos_token=spec.eos,
        pad_token=spec.pad,
        unk_token=spec.unk,
        model_max_length=spec.model_max_length,
        clean_up_tokenization_spaces=False,
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


def _write_zen(hf_home: Path) -> None:
    """The zen configs in the datasets cache, prepared from local parquet files under the repo's name."""
    from datasets import Dataset, load_dataset

    target = dataset_cache_dir(hf_home, f"{ORG}/zen")
    if target.exists():
        shutil.rmtree(target)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "zen"  # the cache directory is named after this folder, then renamed below
        cache = Path(tmp) / "cache"
        readme = ["---", "configs:"]
        for config_name, columns in ZEN_CONFIGS.items():
            splits = Dataset.from_dict(columns).train_test_split(test_size=0.1, shuffle=False)
            (src / config_name).mkdir(parents=True)
            readme += [f"- config_name: {config_name}", "  data_files:"]
            for split, ds in splits.items():
                ds.to_parquet(str(src / config_name / f"{split}-00000-of-00001.parquet"))
                readme += [f"  - split: {split}", f"    path: {config_name}/{split}-*"]
        (src / "README.md").write_text("\n".join([*readme, "---", ""]))
        for config_name in ZEN_CONFIGS:
            load_dataset(str(src), config_name, cache_dir=str(cache))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(cache / "zen", target, ignore=shutil.ignore_patterns("*.lock"))


def _check(hf_home: Path) -> None:
    """Load every stand-in the way the tests do (offline, by hub id) and check the tokenizers round-trip."""
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    for standin in STANDINS:
        kwargs = {"trust_remote_code": True} if standin.extra_files else {}
        tok = AutoTokenizer.from_pretrained(standin.repo_id, **kwargs)
        text = "Hello, world! 3 + 4 = 7\n  done."
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text, (standin.repo_id, tok.decode(ids))
        assert tok.chat_template == _trl_chat_template(standin.tokenizer.template), standin.repo_id
        if standin.tokenizer.word_tokens:
            for i, word in standin.tokenizer.word_tokens.items():
                assert tok.decode([i]) == word, (standin.repo_id, i, tok.decode([i]), word)
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
    for config_name in ZEN_CONFIGS:
        dd = load_dataset(f"{ORG}/zen", config_name)
        print(f"ok  {ORG}/zen {config_name}: " + ", ".join(f"{k} {len(v)}" for k, v in dd.items()))


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
    marker = hf_home / f".standins-v{STANDIN_VERSION}"
    if marker.exists() and not args.force:
        print(f"stand-ins already built in {hf_home} (--force to rebuild)")
    else:
        if marker.exists():
            marker.unlink()
        tokenizers: dict[int, object] = {}
        for standin in STANDINS:
            key = id(standin.tokenizer)
            if key not in tokenizers:
                tokenizers[key] = build_tokenizer(standin.tokenizer)
            _write_model(hf_home, standin, tokenizers[key])
            print(f"built {standin.repo_id}")
        _write_zen(hf_home)
        print(f"built {ORG}/zen ({', '.join(ZEN_CONFIGS)})")
        marker.write_text("\n".join(s.repo_id for s in STANDINS) + f"\n{ORG}/zen\n")
    if args.check:
        _check(hf_home)
    return 0


if __name__ == "__main__":
    sys.exit(main())
