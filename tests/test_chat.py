"""grpokit.data.chat: the one place that tells plain and conversational prompts and completions apart."""

import pytest

from grpokit.data.chat import (
    as_completion,
    completion_text,
    is_conversational,
    render_conversation,
    render_prompt,
)
from grpokit.models import build_char_tokenizer

MESSAGES = [{"role": "system", "content": "add"}, {"role": "user", "content": "1+1="}]


def test_formats_are_told_apart():
    assert is_conversational(MESSAGES) and not is_conversational("1+1=")
    assert not is_conversational([{"content": "no role"}])
    assert as_completion("2", "1+1=") == "2"
    assert as_completion("2", MESSAGES) == [{"role": "assistant", "content": "2"}]


def test_completion_text():
    assert completion_text("2") == "2"
    assert (
        completion_text([{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"text": "b"}]}])
        == "ab"
    )
    assert completion_text([]) == ""
    with pytest.raises(TypeError, match="string or a list"):
        completion_text(3)


def test_render_prompt_and_conversation_with_the_template():
    tok = (
        build_char_tokenizer()
    )  # its template: system content + newline, user content as is, EOS after assistant
    assert render_prompt("1+1=", tok) == "1+1="
    assert render_prompt(MESSAGES, tok) == "add\n1+1="
    assert render_conversation(MESSAGES, "2", tok) == "add\n1+1=2" + tok.eos_token
    assert render_conversation("1+1=", "2", tok) == "1+1=2"
    tok.chat_template = None
    with pytest.raises(ValueError, match="chat_template"):
        render_prompt(MESSAGES, tok)
    with pytest.raises(ValueError, match="chat template"):
        render_conversation(MESSAGES, "2", tok)
