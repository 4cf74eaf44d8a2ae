"""``prompt_truncation="error"`` refuses a prompt longer than ``max_prompt_length`` tokens before training,
counting tokens as the trainer encodes them (chat template and its kwargs included); ``"left"`` leaves the
rows alone and ``encode_prompt`` keeps the last tokens.

The character tokenizer (tests/conftest.py) gives one token per character and adds no special tokens; its
chat template renders a system message as ``content + "\\n"`` and a user message as its content, so the
token counts below are character counts."""

from __future__ import annotations

import pytest
from tokenizers import processors

from grpokit import GRPOConfig
from grpokit.data.chat import encode_prompt
from grpokit.models.tiny import build_char_tokenizer
from grpokit.train.prompts import check_prompt_lengths

ROWS = [
    {"prompt": "12+34="},  # 6 tokens
    {"prompt": [{"role": "system", "content": "Add."}, {"role": "user", "content": "1+2="}]},  # 5 + 4 = 9
    {"prompt": "1234567+7654321="},  # 16 tokens
]


def test_error_mode_names_the_first_prompt_over_the_limit(char_tok):
    args = GRPOConfig(max_prompt_length=12, prompt_truncation="error")
    with pytest.raises(
        ValueError, match=r"^train_dataset row 2: the prompt is 16 tokens, longer than max_prompt_length=12 "
    ):
        check_prompt_lengths(ROWS, char_tok, args, name="train_dataset")
    check_prompt_lengths(ROWS[:2], char_tok, args, name="train_dataset")  # 6 and 9 tokens fit


def test_error_mode_counts_the_chat_template(char_tok):
    args = GRPOConfig(max_prompt_length=8, prompt_truncation="error")
    # The conversational row renders as "Add.\n1+2=": 9 tokens although its user message has 4.
    with pytest.raises(
        ValueError, match=r"^eval_dataset row 1: the prompt is 9 tokens, .*max_prompt_length=8"
    ):
        check_prompt_lengths(ROWS, char_tok, args, name="eval_dataset")
    check_prompt_lengths(
        ROWS[1:2], char_tok, GRPOConfig(max_prompt_length=9, prompt_truncation="error"), name="x"
    )


def test_error_mode_passes_chat_template_kwargs():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = (
        "{% if hint %}Think step by step. {% endif %}"
        "{%- for m in messages -%}{{ m['content'] }}{%- endfor -%}"
    )
    rows = [{"prompt": [{"role": "user", "content": "1+2="}]}]  # 4 tokens; with the hint 4 + 20 = 24
    assert len(encode_prompt(rows[0]["prompt"], tokenizer, None, {"hint": True})) == 24
    check_prompt_lengths(
        rows, tokenizer, GRPOConfig(max_prompt_length=4, prompt_truncation="error"), name="x"
    )
    args = GRPOConfig(max_prompt_length=23, prompt_truncation="error", chat_template_kwargs={"hint": True})
    with pytest.raises(
        ValueError, match=r"^x row 0: the prompt is 24 tokens, longer than max_prompt_length=23"
    ):
        check_prompt_lengths(rows, tokenizer, args, name="x")


def test_special_tokens_count_for_plain_prompts_only():
    # A tokenizer that prepends BOS: a plain prompt gains one token, a rendered chat does not (the template
    # output is encoded without special tokens, as encode_prompt does).
    tokenizer = build_char_tokenizer()
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{tokenizer.bos_token} $A", special_tokens=[(tokenizer.bos_token, tokenizer.bos_token_id)]
    )
    chat = [{"role": "user", "content": "12+34="}]
    assert len(encode_prompt("12+34=", tokenizer)) == 7 and len(encode_prompt(chat, tokenizer)) == 6
    args = GRPOConfig(max_prompt_length=6, prompt_truncation="error")
    check_prompt_lengths([{"prompt": chat}], tokenizer, args, name="train_dataset")
    with pytest.raises(ValueError, match=r"^train_dataset row 1: the prompt is 7 tokens, .*=6 "):
        check_prompt_lengths([{"prompt": chat}, {"prompt": "12+34="}], tokenizer, args, name="train_dataset")


def test_left_mode_and_no_limit_check_nothing(char_tok):
    check_prompt_lengths(ROWS, char_tok, GRPOConfig(max_prompt_length=3), name="train_dataset")  # "left"
    check_prompt_lengths(
        ROWS, char_tok, GRPOConfig(max_prompt_length=None, prompt_truncation="error"), name="t"
    )
    # "left" keeps the last 3 tokens: "21=" of the 16-token prompt.
    assert char_tok.decode(encode_prompt(ROWS[2]["prompt"], char_tok, 3)) == "21="


def test_rows_past_the_first_batch_are_checked(char_tok):
    rows = [{"prompt": "1+1="}] * 1500 + [{"prompt": "11+11="}]
    args = GRPOConfig(max_prompt_length=4, prompt_truncation="error")
    with pytest.raises(ValueError, match=r"^train_dataset row 1500: the prompt is 6 tokens"):
        check_prompt_lengths(rows, char_tok, args, name="train_dataset")
