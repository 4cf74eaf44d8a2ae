"""Tool calls: parsing both formats, refusing malformed calls, and ToolEnvironment's turns and counters."""

from __future__ import annotations

import threading
import time

import pytest

from grpokit.envs.base import Environment
from grpokit.envs.tools import (
    ToolCall,
    ToolCallError,
    ToolEnvironment,
    format_tool_call,
    format_tool_response,
    parse_tool_calls,
    tool_schema,
)

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>'


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def echo(text: str) -> str:
    return text


def boom() -> str:
    raise RuntimeError("tool broke")


def listing() -> list:
    return [1, "x"]


# --- parsing ---------------------------------------------------------------------------------------------


def test_hermes_call_parses_and_text_outside_is_ignored():
    assert parse_tool_calls(CALL) == [ToolCall("calculator", {"expression": "12*34"})]
    assert parse_tool_calls(f"Let me compute.\n{CALL}\nthen answer") == parse_tool_calls(CALL)
    spaced = '<tool_call>\n  {"name": "add",\n "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert parse_tool_calls(spaced) == [ToolCall("add", {"a": 1, "b": 2})]


def test_no_call_gives_empty_list():
    assert parse_tool_calls("") == []
    assert parse_tool_calls("<answer>408</answer>") == []
    assert parse_tool_calls("a stray </tool_call> is text") == []


def test_several_calls_in_order_in_both_formats():
    text = f'{CALL} and <tool_call>{{"name": "add", "arguments": {{"a": 1, "b": 2}}}}</tool_call>'
    assert [c.name for c in parse_tool_calls(text)] == ["calculator", "add"]
    mistral = (
        '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "echo", "arguments": {}}]'
    )
    assert parse_tool_calls(mistral) == [ToolCall("add", {"a": 1, "b": 2}), ToolCall("echo", {})]
    mixed = f"{mistral} {CALL}"
    assert [c.name for c in parse_tool_calls(mixed)] == ["add", "echo", "calculator"]


def test_mistral_variants():
    assert parse_tool_calls('[TOOL_CALLS] {"name": "echo", "arguments": {"text": "hi"}}') == [
        ToolCall("echo", {"text": "hi"})
    ]
    assert parse_tool_calls('[TOOL_CALLS]echo[ARGS]{"text": "hi"}') == [ToolCall("echo", {"text": "hi"})]


def test_parameters_alias_string_arguments_and_missing_arguments():
    assert parse_tool_calls('<tool_call>{"name": "add", "parameters": {"a": 1, "b": 2}}</tool_call>') == [
        ToolCall("add", {"a": 1, "b": 2})
    ]
    as_string = '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>'
    assert parse_tool_calls(as_string) == [ToolCall("add", {"a": 1, "b": 2})]
    assert parse_tool_calls('<tool_call>{"name": "boom"}</tool_call>') == [ToolCall("boom", {})]
    assert parse_tool_calls('<tool_call>{"name": "boom", "arguments": null}</tool_call>') == [
        ToolCall("boom", {})
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('<tool_call>{"name": "add", "arguments": {}}', "never closed"),
        ('<tool_call>{"name": "add", "arguments": {</tool_call>', "invalid JSON"),
        ("<tool_call></tool_call>", "invalid JSON"),
        ('<tool_call>{"arguments": {"a": 1}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": 3, "arguments": {}}</tool_call>', "non-empty string, got a number"),
        ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', "must be a JSON object, got a list"),
        ('<tool_call>{"name": "add", "arguments": "1, 2"}</tool_call>', "string that is not a JSON object"),
        ('<tool_call>["add"]</tool_call>', "must be a JSON object, got a list"),
        ("[TOOL_CALLS][{'name': 'add'}]", "invalid JSON after [TOOL_CALLS]"),
        ("[TOOL_CALLS][]", "empty list"),
        ('<tool_call>{"name": "add", "arguments": {"a": ' + "1" * 5000 + "}}</tool_call>", "invalid JSON in"),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "invalid JSON in"),
        ("[TOOL_CALLS] add me", "neither a JSON list"),
    ],
)
def test_malformed_calls_raise_a_clear_error(text, message):
    with pytest.raises(ToolCallError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_tool_calls(text)
    assert issubclass(ToolCallError, ValueError)


def test_format_helpers_round_trip():
    assert format_tool_call("calculator", {"expression": "12*34"}) == CALL
    assert parse_tool_calls(format_tool_call("add", {"a": 1, "b": 2})) == [ToolCall("add", {"a": 1, "b": 2})]
    assert format_tool_response("408") == "<tool_response>408</tool_response>"
    assert format_tool_response({"x": 1}) == '<tool_response>{"x": 1}</tool_response>'


# --- the environment -------------------------------------------------------------------------------------


def make_env(**kwargs) -> ToolEnvironment:
    env = ToolEnvironment([add, echo, boom, listing], **kwargs)
    env.reset({"prompt": "q"})
    return env


def test_results_are_tagged_and_joined_counters_in_info():
    env = make_env()
    assert isinstance(env, Environment) and env.observation_role == "tool"
    action = format_tool_call("add", {"a": 2, "b": 3}) + format_tool_call("echo", {"text": "hi"})
    turn = env.step(action + format_tool_call("listing", {}))
    assert turn.observation == (
        "<tool_response>5</tool_response><tool_response>hi</tool_response>"
        '<tool_response>[1, "x"]</tool_response>'
    )
    assert not turn.done and turn.reward is None
    assert turn.info == {"tool_calls": 3, "tool_errors": 0, "malformed_tool_calls": 0}


def test_no_call_ends_the_episode_with_final_reward():
    class Scored(ToolEnvironment):
        def final_reward(self, action):
            return 1.0 if action == "done" else 0.0

    turn = make_env().step("<answer>5</answer>")
    assert turn.done and turn.reward is None and turn.info["tool_calls"] == 0
    scored = Scored([add])
    scored.reset({"prompt": "q"})
    assert scored.step("done").reward == 1.0 and scored.step("nope").reward == 0.0


def test_errors_are_results_and_the_episode_goes_on():
    env = make_env()
    action = (
        format_tool_call("search", {"q": "x"})
        + format_tool_call("add", {"a": 1})
        + format_tool_call("boom", {})
        + format_tool_call("add", {"a": 1, "b": 1})
    )
    turn = env.step(action)
    responses = turn.observation.split("</tool_response>")[:-1]
    assert responses[0] == "<tool_response>error: unknown tool 'search' (tools: add, echo, boom, listing)"
    assert responses[1].startswith("<tool_response>error: wrong arguments for add:") and "'b'" in responses[1]
    assert responses[2] == "<tool_response>error: RuntimeError: tool broke"
    assert responses[3] == "<tool_response>2"
    assert not turn.done
    assert turn.info == {"tool_calls": 4, "tool_errors": 3, "malformed_tool_calls": 0}


def test_malformed_call_gives_an_error_observation():
    turn = make_env().step('<tool_call>{"name": "add", "arguments": {"a": 1')
    assert turn.observation.startswith("<tool_response>error: malformed tool call:")
    assert "never closed" in turn.observation and not turn.done
    assert turn.info == {"tool_calls": 0, "tool_errors": 0, "malformed_tool_calls": 1}


def test_malformed_end_makes_a_malformed_call_the_last_action():
    """TRL's reading (its tools= and environment_factory): text whose call does not parse holds no call."""

    class Scored(ToolEnvironment):
        def final_reward(self, action):
            return 0.5

    env = Scored([add], malformed="end")
    env.reset({"prompt": "q"})
    turn = env.step('<tool_call>{"arguments": {"a": 1, "b": 2}}</tool_call>')  # no "name"
    assert turn.done and turn.reward == 0.5 and turn.observation is None
    assert turn.info == {"tool_calls": 0, "tool_errors": 0, "malformed_tool_calls": 1}
    with pytest.raises(ValueError, match="malformed must be 'answer' or 'end'"):
        ToolEnvironment([add], malformed="skip")


def test_async_tools_run_to_their_result():
    async def times(a: int, b: int) -> int:
        return a * b

    env = ToolEnvironment([times])
    turn = env.step(format_tool_call("times", {"a": 3, "b": 4}) + format_tool_call("times", {"a": 3, "c": 4}))
    responses = turn.observation.split("</tool_response>")[:-1]
    assert responses[0] == "<tool_response>12"  # 3 * 4
    assert responses[1].startswith("<tool_response>error: wrong arguments for times:")
    assert turn.info == {"tool_calls": 2, "tool_errors": 1, "malformed_tool_calls": 0}


def test_calls_past_the_limit_are_not_run():
    env = make_env(max_calls_per_turn=2)
    turn = env.step(format_tool_call("echo", {"text": "a"}) * 3)
    assert turn.observation.count("<tool_response>a</tool_response>") == 2
    assert "error: not run: at most 2 tool calls per turn" in turn.observation
    assert turn.info == {"tool_calls": 3, "tool_errors": 1, "malformed_tool_calls": 0}


def test_a_hanging_tool_is_bounded_by_the_timeout():
    release = threading.Event()

    def hang() -> str:
        release.wait(300)
        return "late"

    env = ToolEnvironment({"hang": hang, "echo": echo}, timeout=0.2)
    env.reset({"prompt": "q"})
    start = time.monotonic()
    try:
        turn = env.step(format_tool_call("hang", {}) + format_tool_call("echo", {"text": "ok"}))
    finally:
        release.set()
    assert time.monotonic() - start < 60  # the 0.2 s limit, not the 300 s wait
    assert turn.observation == (
        "<tool_response>error: hang timed out after 0.2 s</tool_response><tool_response>ok</tool_response>"
    )
    assert turn.info["tool_errors"] == 1


def test_long_results_are_cut():
    env = make_env(max_response_chars=10)
    turn = env.step(format_tool_call("echo", {"text": "x" * 50}))
    assert turn.observation == "<tool_response>xxxxxxx...</tool_response>"


def test_chat_prompts_get_tool_messages():
    env = ToolEnvironment([add])
    env.reset({"prompt": [{"role": "user", "content": "2+3?"}]})
    turn = env.step(format_tool_call("add", {"a": 2, "b": 3}))
    assert turn.observation == [{"role": "tool", "content": "5", "name": "add"}]


def test_bad_construction_is_refused():
    with pytest.raises(ValueError, match="at least one tool"):
        ToolEnvironment([])
    with pytest.raises(ValueError, match="not usable"):
        ToolEnvironment([lambda: 1])
    with pytest.raises(ValueError, match="two tools"):
        ToolEnvironment([add, add])
    with pytest.raises(TypeError, match="not callable"):
        ToolEnvironment({"x": 3})
    with pytest.raises(ValueError, match="timeout"):
        ToolEnvironment([add], timeout=0)
    with pytest.raises(ValueError, match="max_calls_per_turn"):
        ToolEnvironment([add], max_calls_per_turn=0)
    with pytest.raises(TypeError, match="dict"):
        ToolEnvironment([add]).reset("row")


def test_tool_schema_from_docstring_and_fallback():
    schema = tool_schema(add)
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == "add" and function["description"] == "Add two integers."
    assert function["parameters"]["properties"]["a"] == {
        "type": "integer",
        "description": "The first integer.",
    }
    assert function["parameters"]["required"] == ["a", "b"]
    fallback = tool_schema(echo)["function"]  # no docstring: transformers refuses it
    assert fallback["name"] == "echo"
    assert fallback["parameters"] == {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    }
    assert [s["function"]["name"] for s in ToolEnvironment({"plus": add}).schemas()] == ["plus"]
