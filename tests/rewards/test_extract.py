"""Final-answer extraction and completion text, including malformed and megabyte inputs."""

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpokit.rewards import completion_text, extract_code
from grpokit.rewards.extract import (
    extract_answer_tag,
    extract_auto,
    extract_boxed,
    extract_hash_answer,
    extract_last_number,
    get_extractor,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{\frac{1}{2}} then \boxed{\frac{3}{4}}", r"\frac{3}{4}"),  # the last box wins
        (r"\boxed{ {a}+{b} }", "{a}+{b}"),  # nested braces, stripped
        (r"\fbox{7}", "7"),
        (r"\boxed 5 apples", "5"),
        (r"\boxed{12", None),  # never closed: truncated completion
        ("no box at all", None),
        (r"\boxed", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_extract_answer_tag_hash_and_last_number():
    assert extract_answer_tag("<answer> 1 </answer> <answer>2</answer>") == "2"
    assert extract_answer_tag("<answer>3") is None
    assert extract_hash_answer("work\n#### 1,234.\nbye") == "1,234"
    assert extract_hash_answer("####   \n") is None
    assert extract_last_number("from -3 to 4.5 and 7/8 or 1,000") == "1,000"
    assert extract_last_number("from -3 to 4.5") == "4.5"
    assert extract_last_number("x = -.5") == "-.5"
    assert extract_last_number("none") is None


def test_auto_prefers_answer_tag_then_box_then_hash_then_number():
    assert extract_auto(r"<think>\boxed{3}</think><answer>4</answer>") == "4"
    assert extract_auto(r"\boxed{3} #### 5") == "3"
    assert extract_auto("#### 5\nthen 6") == "5"
    assert extract_auto("just 6") == "6"
    assert extract_auto("nothing") is None


def test_unknown_extractor_lists_choices():
    with pytest.raises(ValueError, match="boxed"):
        get_extractor("nope")
    assert get_extractor(str.upper) is str.upper


@pytest.mark.parametrize(
    "text",
    [
        "\\boxed{" * 200_000,  # a megabyte of unclosed boxes
        "{" * 1_000_000 + r"\boxed{1",
        "<answer>" * 100_000,
        "1" * 1_000_000,
        "#### " * 200_000,
    ],
)
def test_extraction_is_linear_on_megabyte_input(text):
    start = time.monotonic()
    extract_auto(text)
    assert time.monotonic() - start < 20  # linear: well under a second; quadratic: hours


def test_completion_text_accepts_strings_and_messages():
    assert completion_text("plain") == "plain"
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert completion_text(messages) == "a"
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]}]
    assert completion_text(parts) == "xy"
    assert completion_text([]) == ""
    with pytest.raises(TypeError):
        completion_text(42)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("\\boxed{}<answer>/#1.-, x\n")), max_size=200))
def test_extractors_return_a_piece_of_the_text_or_none(text):
    for extract in (
        extract_auto,
        extract_boxed,
        extract_answer_tag,
        extract_hash_answer,
        extract_last_number,
    ):
        answer = extract(text)
        assert answer is None or answer in text
    assert extract_code(text) in text
