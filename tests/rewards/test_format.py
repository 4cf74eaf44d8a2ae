"""Format rewards: exact tag structure, configurable pattern and prefix, linear time on hostile input."""

import time

import pytest

from grpokit.rewards import (
    answer_tag_format_reward,
    make_format_reward,
    make_tag_count_reward,
    tag_count_reward,
    think_format_reward,
)


def score(func, texts):
    return func([""] * len(texts), texts, [[]] * len(texts))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>reason</think>The answer is 4.", 1.0),
        ("\n<think>\nmulti\nline\n</think>\n\n42", 1.0),  # newlines anywhere
        ("<think>reason</think>", 0.0),  # no answer after the think block
        ("<think>   </think>42", 0.0),  # empty reasoning
        ("42<think>reason</think>", 0.0),  # answer before the think block
        ("<think>a</think>b<think>c</think>d", 0.0),  # two think blocks
        ("<think>a<think>b</think>c", 0.0),  # nested open tag
        ("<think>never closed, 42", 0.0),
        ("<think>a</think><answer>b</answer>", 0.0),  # stray answer tags are not plain answers
        ("", 0.0),
    ],
)
def test_think_format(text, expected):
    assert score(think_format_reward, [text]) == [expected]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>r</think><answer>4</answer>", 1.0),
        ("<think>\nr\n</think>\n<answer>\n4\n</answer>\n", 1.0),
        ("<think>r</think> text <answer>4</answer>", 0.0),  # nothing allowed between the blocks
        ("<think>r</think><answer>4</answer> trailing", 0.0),
        ("<think>r</think><answer></answer>", 0.0),
        ("<answer>4</answer><think>r</think>", 0.0),
        ("<think>r</think><answer>4", 0.0),
    ],
)
def test_answer_tag_format(text, expected):
    assert score(answer_tag_format_reward, [text]) == [expected]


def test_conversational_completion_uses_last_message():
    good = [{"role": "assistant", "content": "<think>r</think>4"}]
    bad = [{"role": "assistant", "content": "4"}]
    assert think_format_reward(["q", "q"], [good, bad], [[], []]) == [1.0, 0.0]


def test_prefix_for_templates_that_open_the_think_block():
    reward = make_format_reward(prefix="<think>")
    assert score(reward, ["reasoning</think>4", "<think>reasoning</think>4"]) == [1.0, 0.0]


def test_custom_pattern_and_name():
    reward = make_format_reward(r"Answer: (\d+)", name="digits_only")
    assert reward.__name__ == "digits_only"
    assert score(reward, ["Answer: 12", "Answer: twelve", "Answer: 12!"]) == [1.0, 0.0, 0.0]
    lenient = make_format_reward(r"Answer:(\s*)\d+", nonempty_groups=False)
    assert score(lenient, ["Answer:12"]) == [1.0]


def test_tag_count_partial_credit():
    # 4 markers, 0.25 each for exactly one occurrence
    texts = ["<think>a</think><answer>b</answer>", "<think>a</think>", "<think><think></think>", "none"]
    assert score(tag_count_reward, texts) == [1.0, 0.5, 0.25, 0.0]
    assert score(make_tag_count_reward(("x",)), ["<x></x>"]) == [1.0]
    with pytest.raises(ValueError):
        make_tag_count_reward(())


@pytest.mark.parametrize(
    "text",
    [
        "<think>" + "a" * 1_000_000 + "</think>" + "b" * 1_000_000 + "<think>",
        "<think>" * 200_000,
        "<think>" + "</think>" * 200_000,
        " " * 1_000_000 + "<think>a</think>",
    ],
)
def test_format_rewards_are_fast_on_megabyte_input(text):
    start = time.monotonic()
    for reward in (think_format_reward, answer_tag_format_reward, tag_count_reward):
        score(reward, [text])
    assert time.monotonic() - start < 30  # linear: about a second; quadratic: hours
