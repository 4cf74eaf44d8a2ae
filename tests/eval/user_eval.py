"""What a user brings to ``grpokit eval`` that grpokit does not ship: a tiny random Qwen2 model built from a
config, with a chat template that reads a template variable; prompt rows with a ``solution``; a reward
function in a module of their own. And the independent reference: plain ``transformers`` greedy decoding
per prompt with the rewards applied by hand.

The model is random but made to stop sometimes: the EOS row of its LM head is 1.05 x the row of "2", so
wherever "2" would win with a positive logit, EOS wins instead. Its greedy completions (10 tokens) of the
rows below mix EOS stops, truncations, digits and tags, so every metric gets a non-trivial value.
"""

from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

from grpokit.models.tiny import build_char_tokenizer

REWARD_MODULE = "user_eval_rewards"
TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if terse -%}{{ m['content'] }}"
    "{%- else -%}{{ 'Q: ' + m['content'] + '\\nA:' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
)
"""A user message renders as ``Q: <content>\\nA:``, or as the bare content with ``terse=True``."""

ROWS: list[dict[str, Any]] = [
    {"prompt": "What is 2+2?", "solution": "4"},
    {"prompt": "Add 13 and 29.", "solution": "7"},
    {"prompt": "7*6=", "solution": "42"},
    {"prompt": "count: 1 2 3", "solution": "4"},
    {"prompt": "9", "solution": "3"},
    {"prompt": "3 squared", "solution": None},  # the user reward does not apply here (None)
    {"prompt": [{"role": "user", "content": "12+30"}], "solution": "Y"},
    {"prompt": [{"role": "user", "content": "3 squared"}], "solution": "T"},
]
MAX_NEW_TOKENS = 10
WEIGHTS = (1.0, 0.5)  # digit_reward, tag_count
TAGS = ("<think>", "</think>", "<answer>", "</answer>")

REWARD_SOURCE = '''
def digit_reward(prompts, completions, solution, **kwargs):
    """1.0 when the solution occurs in the completion, plus 0.25 per digit; None without a solution."""
    out = []
    for completion, answer in zip(completions, solution):
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        if answer is None:
            out.append(None)
        else:
            out.append((1.0 if answer in text else 0.0) + 0.25 * sum(ch.isdigit() for ch in text))
    return out


def first_word(text):
    """An answer extractor of the user's: the first whitespace-separated word, or None."""
    words = text.split()
    return words[0] if words else None
'''


def write_reward_module(directory: Path, monkeypatch: Any) -> str:
    """Write the user's reward module into ``directory``, put it on sys.path; returns its name."""
    (directory / f"{REWARD_MODULE}.py").write_text(textwrap.dedent(REWARD_SOURCE))
    monkeypatch.syspath_prepend(str(directory))
    monkeypatch.delitem(sys.modules, REWARD_MODULE, raising=False)
    return REWARD_MODULE


def build_user_model(directory: Path) -> Path:
    """A random 2-layer Qwen2 model and a character tokenizer with :data:`TEMPLATE`, saved in ``directory``
    (returned)."""
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = TEMPLATE
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        two = tokenizer.convert_tokens_to_ids("2")
        model.lm_head.weight[tokenizer.eos_token_id] = 1.05 * model.lm_head.weight[two]
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def greedy_by_hand(
    directory: Path, rows: list[dict[str, Any]], max_new_tokens: int, **template_kwargs: Any
) -> list[dict[str, Any]]:
    """Per row, plain ``transformers``: load, render (``apply_chat_template`` for messages), tokenize,
    ``model.generate(do_sample=False)`` one prompt at a time; the completion's ids (EOS kept), text
    (special tokens skipped) and whether it ran out of tokens."""
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(directory)
    out = []
    for row in rows:
        prompt = row["prompt"]
        if not isinstance(prompt, str):
            prompt = tokenizer.apply_chat_template(
                prompt, tokenize=False, add_generation_prompt=True, **template_kwargs
            )
        inputs = tokenizer(prompt, return_tensors="pt")
        generated = model.generate(
            **inputs,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        ids = generated[0, inputs["input_ids"].shape[1] :].tolist()
        out.append(
            {
                "ids": ids,
                "text": tokenizer.decode(ids, skip_special_tokens=True),
                "truncated": tokenizer.eos_token_id not in ids,
            }
        )
    return out


def rewards_by_hand(rows: list[dict[str, Any]], texts: list[str]) -> list[tuple[float | None, float]]:
    """(digit_reward, tag_count) of each completion, computed here without grpokit."""
    pairs = []
    for row, text in zip(rows, texts):
        answer = row["solution"]
        digit = None if answer is None else float(answer in text) + 0.25 * sum(ch.isdigit() for ch in text)
        tags = sum(text.count(tag) == 1 for tag in TAGS) / len(TAGS)
        pairs.append((digit, tags))
    return pairs


def expected_metrics(rows: list[dict[str, Any]], reference: list[dict[str, Any]], threshold: float) -> dict:
    """The metrics of greedy completions ``reference``, by hand: weighted sums, means, accuracy, lengths."""
    pairs = rewards_by_hand(rows, [r["text"] for r in reference])
    combined = [WEIGHTS[1] * tags + (0.0 if digit is None else WEIGHTS[0] * digit) for digit, tags in pairs]
    digits = [digit for digit, _ in pairs if digit is not None]
    n = len(rows)
    return {
        "combined": combined,
        "correct": [value >= threshold for value in combined],
        "accuracy": sum(value >= threshold for value in combined) / n,
        "mean_reward": math.fsum(combined) / n,
        "digit_mean": math.fsum(digits) / len(digits),
        "tag_mean": math.fsum(tags for _, tags in pairs) / n,
        "mean_completion_tokens": sum(len(r["ids"]) for r in reference) / n,
        "truncated_rate": sum(r["truncated"] for r in reference) / n,
    }
