"""Tool calls: parse them from a policy's turn, run them, answer with their results.

Formats read by :func:`parse_tool_calls` (text outside the calls is ignored; calls come back in the order
they appear):

- **Hermes / Qwen** (what the chat templates of Qwen2.5, Qwen3, Hermes and SmolLM3 expect): one JSON
  object per tag, whitespace and newlines inside the tag allowed::

      <tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>

  ``"parameters"`` is accepted for ``"arguments"``, and so are arguments given as a JSON string holding an
  object (``"arguments": "{\\"expression\\": \\"12*34\\"}"``), as some models write them.
- **Mistral**: a JSON list (or one object) after the marker, or the newer ``name[ARGS]{...}`` form::

      [TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "12*34"}}]
      [TOOL_CALLS]calculator[ARGS]{"expression": "12*34"}

Observations of :class:`ToolEnvironment` (plain-text prompts): each call's result in its own tag, joined
with nothing, no newline before, between or after (compact for a character-level policy)::

    <tool_response>408</tool_response>
    <tool_response>408</tool_response><tool_response>error: unknown tool 'search'</tool_response>

A string result is written as is, anything else as ``json.dumps(result)``. With a chat prompt (the row's
``prompt`` is a list of messages) the observation is instead one ``{"role": "tool", "name": ...,
"content": RESULT}`` message per call, untagged: chat templates wrap tool messages in their own
``<tool_response>`` markup.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import re
import threading
import typing
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from grpokit.envs.base import Turn

__all__ = [
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "TOOL_RESPONSE_CLOSE",
    "TOOL_RESPONSE_OPEN",
    "ToolCall",
    "ToolCallError",
    "ToolEnvironment",
    "format_tool_call",
    "format_tool_response",
    "parse_tool_calls",
    "tool_schema",
    "tool_table",
]

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
MISTRAL_MARKER, MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"
_TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
_DECODER = json.JSONDecoder()


@dataclass
class ToolCall:
    """One call the policy asked for: the tool's name and its keyword arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


class ToolCallError(ValueError):
    """A malformed tool call; the message says what is wrong with it."""


def format_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """The Hermes/Qwen text of one call: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""
    return f"{TOOL_CALL_OPEN}{json.dumps({'name': name, 'arguments': dict(arguments)})}{TOOL_CALL_CLOSE}"


def format_tool_response(result: Any) -> str:
    """One result as ``<tool_response>RESULT</tool_response>`` (a str as is, anything else JSON)."""
    return f"{TOOL_RESPONSE_OPEN}{_result_text(result)}{TOOL_RESPONSE_CLOSE}"


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every tool call in ``text`` (both formats of the module docstring), in order; [] when there is none.

    Raises :class:`ToolCallError` for a malformed call: a ``<tool_call>`` never closed, invalid JSON, a
    call that is not an object, a missing or non-string name, arguments that are not an object.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_tool_calls takes a str, got {type(text).__name__}")
    calls: list[ToolCall] = []
    pos = 0
    while True:
        hermes, mistral = text.find(TOOL_CALL_OPEN, pos), text.find(MISTRAL_MARKER, pos)
        if hermes < 0 and mistral < 0:
            return calls
        if mistral < 0 or 0 <= hermes < mistral:
            call, pos = _parse_hermes(text, hermes + len(TOOL_CALL_OPEN))
            calls.append(call)
        else:
            more, pos = _parse_mistral(text, mistral + len(MISTRAL_MARKER))
            calls.extend(more)


def _parse_hermes(text: str, start: int) -> tuple[ToolCall, int]:
    """The call inside the tag whose content starts at ``start``, and the index after its close tag."""
    end = text.find(TOOL_CALL_CLOSE, start)
    if end < 0:
        raise ToolCallError(f"{TOOL_CALL_OPEN} is never closed by {TOOL_CALL_CLOSE}")
    body = text[start:end].strip()
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as err:
        raise ToolCallError(f"invalid JSON in {TOOL_CALL_OPEN}: {_why(err)}") from None
    return _as_call(value), end + len(TOOL_CALL_CLOSE)


def _parse_mistral(text: str, start: int) -> tuple[list[ToolCall], int]:
    """The calls after a ``[TOOL_CALLS]`` marker whose end is ``start``, and the index after them."""
    rest = _skip_space(text, start)
    if text.startswith(("[", "{"), rest):
        value, end = _decode(text, rest, MISTRAL_MARKER)
        items = value if isinstance(value, list) else [value]
        if not items:
            raise ToolCallError(f"{MISTRAL_MARKER} is followed by an empty list")
        return [_as_call(item) for item in items], end
    args_at = text.find(MISTRAL_ARGS, rest)
    if args_at < 0:
        raise ToolCallError(
            f"{MISTRAL_MARKER} is followed by neither a JSON list nor name{MISTRAL_ARGS}{{...}}"
        )
    value, end = _decode(text, args_at + len(MISTRAL_ARGS), MISTRAL_ARGS)
    return [_as_call({"name": text[rest:args_at].strip(), "arguments": value})], end


def _decode(text: str, start: int, after: str) -> tuple[Any, int]:
    """One JSON value starting at ``start`` (leading whitespace skipped) and the index after it."""
    try:
        return _DECODER.raw_decode(text, _skip_space(text, start))
    except (ValueError, RecursionError) as err:
        raise ToolCallError(f"invalid JSON after {after}: {_why(err)}") from None


def _why(err: Exception) -> str:
    """What a JSON decoding failure says: the decoder's message and position, or the error's own text
    (an integer beyond Python's digit limit, nesting too deep)."""
    if isinstance(err, json.JSONDecodeError):
        return f"{err.msg} (at character {err.pos})"
    return str(err).split(";")[0] or type(err).__name__


def _skip_space(text: str, index: int) -> int:
    """The first index at or after ``index`` that is not whitespace (``len(text)`` if none)."""
    while index < len(text) and text[index].isspace():
        index += 1
    return index


def _as_call(value: Any) -> ToolCall:
    """A :class:`ToolCall` from a decoded call object; ToolCallError saying what is missing or wrong."""
    if not isinstance(value, dict):
        raise ToolCallError(f"a tool call must be a JSON object, got {_json_type(value)}")
    name = value.get("name")
    if name is None:
        raise ToolCallError('a tool call has no "name"')
    if not isinstance(name, str) or not name.strip():
        raise ToolCallError(f'a tool call\'s "name" must be a non-empty string, got {_json_type(name)}')
    arguments = value.get("arguments", value.get("parameters"))
    if arguments is None:  # no arguments, or null: a tool without parameters
        arguments = {}
    if isinstance(arguments, str):  # some models write the arguments as a JSON string holding an object
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            raise ToolCallError(f"the arguments of {name!r} are a string that is not a JSON object") from None
    if not isinstance(arguments, dict):
        raise ToolCallError(f"the arguments of {name!r} must be a JSON object, got {_json_type(arguments)}")
    return ToolCall(name=name.strip(), arguments=arguments)


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _result_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result)
    except (TypeError, ValueError):
        return str(result)


class ToolEnvironment:
    """An :class:`~grpokit.envs.base.Environment` whose policy calls tools (Python functions).

    ``step(action)``: an action with no tool call ends the episode with ``reward=self.final_reward(action)``
    (override it; the base class gives None). Otherwise every call runs with its keyword arguments and the
    observation holds the results in order (format in the module docstring). An unknown tool, arguments the
    function does not take, a tool that raises or one that runs past ``timeout`` seconds give
    ``error: ...`` as that call's result and count in ``info["tool_errors"]``; calls past
    ``max_calls_per_turn`` are not run and count as errors too. A malformed call gives one error result
    and counts ``info["malformed_tool_calls"]`` (no call of that turn runs); with ``malformed="end"``
    (TRL's reading, for its ``tools=`` and ``environment_factory``: text whose calls do not parse holds no
    call) it is instead the episode's last action, scored by :meth:`final_reward`, and still counted.
    ``info["tool_calls"]`` counts well-formed calls; all three keys are in every turn's info. The episode
    goes on after any other error. A tool may be a coroutine function (``async def``): it runs to the end
    in its call's thread (``asyncio.run``).

    Timeout: each call runs in a fresh daemon thread and the episode stops waiting after ``timeout``
    seconds. A Python thread cannot be killed: a hung tool keeps its thread (and whatever it holds) until
    it returns by itself, and a tool busy in pure Python slows the trainer meanwhile. For untrusted or
    unbounded work use a tool that bounds itself (a sandboxed subprocess).

    Results longer than ``max_response_chars`` are cut there and end with ``...``.
    """

    observation_role = "tool"

    def __init__(
        self,
        tools: Sequence[Callable[..., Any]] | Mapping[str, Callable[..., Any]],
        *,
        timeout: float = 5.0,
        max_calls_per_turn: int = 4,
        max_response_chars: int = 2000,
        malformed: str = "answer",
    ):
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if not (isinstance(max_calls_per_turn, int) and max_calls_per_turn >= 1):
            raise ValueError(f"max_calls_per_turn must be an integer >= 1, got {max_calls_per_turn!r}")
        if not (isinstance(max_response_chars, int) and max_response_chars >= 8):
            raise ValueError(f"max_response_chars must be an integer >= 8, got {max_response_chars!r}")
        if malformed not in ("answer", "end"):
            raise ValueError(f"malformed must be 'answer' or 'end', got {malformed!r}")
        self.tools = tool_table(tools)
        if not self.tools:
            raise ValueError("a ToolEnvironment needs at least one tool")
        self.malformed = malformed
        self.timeout = float(timeout)
        self.max_calls_per_turn = max_calls_per_turn
        self.max_response_chars = max_response_chars
        self.row: dict[str, Any] = {}

    def reset(self, row: dict[str, Any]) -> None:
        """Start an episode on ``row`` (kept as ``self.row`` for :meth:`final_reward`)."""
        if not isinstance(row, Mapping):
            raise TypeError(f"reset takes a data-set row (a dict), got {type(row).__name__}")
        self.row = dict(row)

    def final_reward(self, action: str) -> float | None:
        """The reward of the episode's last action (the one without a tool call); None here."""
        return None

    def schemas(self) -> list[dict[str, Any]]:
        """The JSON schema of every tool (:func:`tool_schema`), for a chat template's ``tools=``."""
        return [tool_schema(fn, name=name) for name, fn in self.tools.items()]

    def step(self, action: str) -> Turn:
        """Run the tool calls in ``action``; no call ends the episode (see the class docstring)."""
        info = {"tool_calls": 0, "tool_errors": 0, "malformed_tool_calls": 0}
        try:
            calls = parse_tool_calls(action)
        except ToolCallError as err:
            info["malformed_tool_calls"] = 1
            if self.malformed == "end":
                return Turn(reward=self.final_reward(action), done=True, info=info)
            error = f"error: malformed tool call: {err}"
            return Turn(observation=self._observation([("", error)]), info=info)
        if not calls:
            return Turn(reward=self.final_reward(action), done=True, info=info)
        results = []
        for index, call in enumerate(calls):
            if index < self.max_calls_per_turn:
                ok, text = self.call(call)
            else:
                ok, text = False, f"error: not run: at most {self.max_calls_per_turn} tool calls per turn"
            info["tool_calls"] += 1
            info["tool_errors"] += not ok
            results.append((call.name, text))
        return Turn(observation=self._observation(results), info=info)

    def call(self, call: ToolCall) -> tuple[bool, str]:
        """Run one call: ``(True, result text)``, or ``(False, "error: ...")``. Never raises."""
        fn = self.tools.get(call.name)
        if fn is None:
            return False, f"error: unknown tool {call.name!r} (tools: {', '.join(self.tools)})"
        try:
            inspect.signature(fn).bind(**call.arguments)
        except TypeError as err:
            return False, f"error: wrong arguments for {call.name}: {err}"
        except ValueError:  # no signature (some builtins): let the call itself say
            pass
        future = _start(fn, call.arguments)
        try:
            result = future.result(timeout=self.timeout)
        except Exception as err:
            if not future.done():
                return False, f"error: {call.name} timed out after {self.timeout:g} s"
            return False, f"error: {type(err).__name__}: {err}"
        text, limit = _result_text(result), self.max_response_chars
        return True, text if len(text) <= limit else text[: limit - 3] + "..."

    def _observation(self, results: list[tuple[str, str]]) -> Any:
        """Plain prompts: the tagged results joined; chat prompts: one tool message per result."""
        if isinstance(self.row.get("prompt"), (list, tuple)):
            return [
                {"role": "tool", "content": text} | ({"name": name} if name else {}) for name, text in results
            ]
        return "".join(format_tool_response(text) for _, text in results)


def tool_table(tools: Any) -> dict[str, Callable[..., Any]]:
    """``{name: function}`` from a mapping or a sequence of functions (named by ``__name__``; bound methods
    too); an empty one is allowed here. A name that is not usable, or used twice, is a ValueError."""
    if isinstance(tools, Mapping):
        pairs = list(tools.items())
    elif isinstance(tools, Sequence) and not isinstance(tools, str):
        pairs = [(getattr(fn, "__name__", None), fn) for fn in tools]
    else:
        raise TypeError(f"tools must be a list of functions or a {{name: function}} dict, got {tools!r}")
    table: dict[str, Callable[..., Any]] = {}
    for name, fn in pairs:
        if not callable(fn):
            raise TypeError(f"tool {name!r} is not callable: {fn!r}")
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise ValueError(
                f"tool name {name!r} is not usable (letters, digits, _ . -, starting with a letter or _); "
                "pass a {name: function} dict to name it"
            )
        if name in table:
            raise ValueError(f"two tools are named {name!r}")
        table[name] = fn
    return table


def _start(fn: Callable[..., Any], arguments: dict[str, Any]) -> Future[Any]:
    """Run ``fn(**arguments)`` in a new daemon thread (never blocks interpreter exit); its Future."""
    future: Future[Any] = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = fn(**arguments)
            future.set_result(asyncio.run(result) if inspect.iscoroutine(result) else result)
        except Exception as err:
            future.set_exception(err)
        except BaseException as err:  # SystemExit & co. must not cross into the trainer's thread
            future.set_exception(RuntimeError(f"the tool raised {type(err).__name__}"))

    threading.Thread(target=run, name=f"grpokit-tool-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return future


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def tool_schema(fn: Callable[..., Any], *, name: str | None = None) -> dict[str, Any]:
    """The OpenAI / Hugging Face JSON schema of a tool function (what chat templates' ``tools=`` take):
    ``{"type": "function", "function": {"name", "description", "parameters"}}``.

    Uses ``transformers.utils.get_json_schema`` (type hints, Google-style docstring with ``Args:``); when
    that refuses the function (no docstring, an undocumented argument), falls back to the signature alone:
    basic types mapped to JSON types, the docstring's first paragraph as description. ``name`` overrides
    the function's ``__name__``.
    """
    if not callable(fn):
        raise TypeError(f"tool_schema takes a function, got {fn!r}")
    try:
        from transformers.utils import get_json_schema

        schema = get_json_schema(fn)
    except Exception:
        schema = _signature_schema(fn)
    if name is not None:
        schema["function"]["name"] = name
    return schema


def _signature_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The schema from the signature and type hints only (see :func:`tool_schema`)."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an unresolvable annotation: no types
        hints = {}
    properties: dict[str, Any] = {}
    required = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        hint = hints.get(param.name)
        kind = _JSON_TYPES.get(typing.get_origin(hint) or hint)
        properties[param.name] = {"type": kind} if kind else {}
        if param.default is param.empty:
            required.append(param.name)
    description = (inspect.getdoc(fn) or "").split("\n\n", 1)[0].strip()
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    function = {"name": getattr(fn, "__name__", "tool"), "description": description, "parameters": parameters}
    return {"type": "function", "function": function}
