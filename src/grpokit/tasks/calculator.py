"""A built-in multi-turn task: multiplication a tiny model cannot do in its head, with a calculator tool.

Prompt (a plain string, no chat markup)::

    347*86=

The episode runs in :class:`grpokit.envs.calculator.CalculatorEnvironment`. The policy may call the tool
(one turn, ended by EOS), reads the tool's answer, then answers (its turn without a tool call ends the
episode)::

    347*86=                                                                       prompt
    <tool_call>{"name": "calculator", "arguments": {"expression": "347*86"}}</tool_call>   policy (+EOS)
    <tool_response>29842</tool_response>                                          environment
    <answer>29842</answer>                                                        policy (+EOS)

or answers at once: ``<answer>29842</answer>``. The cold start (:func:`worked_episode`) shows both: a
fixed ``tool_fraction`` share of the rows (by a hash of the prompt, stored in the row as
``worked_tool_call``) calls the tool, the others answer directly. A tiny model cannot multiply a
3-digit number by a 2-digit one reliably, so after the cold start its direct answers are mostly guesses
and GRPO has to find that calling the tool pays.

The train and held-out splits never share a question (the hash of :mod:`grpokit.tasks.arithmetic`).
The episode's reward comes from the environment; :data:`calculator_exact_answer_reward` grades a whole
transcript the same way (the tool's responses never hold ``<answer>``, so the last tag is the policy's).
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from grpokit.envs.calculator import CalculatorEnvironment
from grpokit.envs.tools import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    format_tool_call,
)
from grpokit.tasks.answers import integer_answer, make_integer_answer_reward
from grpokit.tasks.arithmetic import ANSWER_CLOSE, ANSWER_OPEN, HELD_OUT_FRACTION, is_held_out

__all__ = [
    "TOOL_TAGS",
    "calculator_exact_answer_reward",
    "extract_answer",
    "make_calculator_splits",
    "uses_tool",
    "worked_episode",
    "worked_solution",
]

TOOL_TAGS = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE)
"""Tags the character tokenizer adds as single tokens (``build_char_tokenizer(tags=DEFAULT_TAGS +
TOOL_TAGS)``)."""
MULTIPLIER_DIGITS = 2
"""The second factor always has two digits (10..99)."""


def make_calculator_splits(
    seed: int = 0,
    num_train: int = 5000,
    num_test: int = 200,
    *,
    num_digits: int = 3,
    tool_fraction: float = 0.3,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Generate ``(train, test)`` rows from ``seed``; the same arguments always give the same rows.

    Each row: ``prompt`` (``"347*86="``), ``solution`` (the exact product as a string, ``"29842"``),
    ``terms`` (``[347, 86]``), ``expression`` (``"347*86"``) and ``worked_tool_call`` (whether the cold
    start's episode of this row calls the tool: :func:`uses_tool` with ``tool_fraction``). Questions are
    distinct within a split; the splits are disjoint whatever the seeds and sizes (a fixed ~10% of all
    questions, by a hash of the prompt, may only be held out); each split has its own random stream, so a
    smaller ``num_train`` (``num_test``) gives a prefix of a larger one.

    Difficulty: a ``num_digits``-digit number (>= 1 digits, uniform) times a 2-digit number (10..99).
    """
    if not isinstance(num_digits, int) or num_digits < 1:
        raise ValueError(f"num_digits must be an integer >= 1, got {num_digits!r}")
    if not isinstance(tool_fraction, (int, float)) or not 0.0 <= tool_fraction <= 1.0:
        raise ValueError(f"tool_fraction must be between 0 and 1, got {tool_fraction!r}")
    for name, value in (("num_train", num_train), ("num_test", num_test)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    low, high = (10 ** (num_digits - 1) if num_digits > 1 else 0), 10**num_digits - 1
    space = (high - low + 1) * 90
    if num_train > space * (1 - HELD_OUT_FRACTION) / 2 or num_test > space * HELD_OUT_FRACTION / 2:
        raise ValueError(
            f"asked for {num_train} train and {num_test} held-out questions but only {space} exist with "
            f"num_digits={num_digits}; lower num_train/num_test or raise num_digits"
        )

    def draw(stream: str, n: int, held_out: bool) -> list[dict[str, Any]]:
        rng = random.Random(f"grpokit-calculator-{stream}-{seed}")
        rows: list[dict[str, Any]] = []
        seen: set[str] = set()
        for _ in range(100 * n + 10_000):
            if len(rows) == n:
                break
            terms = [rng.randint(low, high), rng.randint(10, 99)]
            expression = f"{terms[0]}*{terms[1]}"
            prompt = expression + "="
            if prompt not in seen and is_held_out(prompt) == held_out:
                seen.add(prompt)
                rows.append(
                    {
                        "prompt": prompt,
                        "solution": str(terms[0] * terms[1]),
                        "terms": terms,
                        "expression": expression,
                        "worked_tool_call": uses_tool(prompt, tool_fraction),
                    }
                )
        if len(rows) < n:
            raise ValueError(f"could not draw {n} distinct {stream} questions with num_digits={num_digits}")
        return rows

    return draw("train", num_train, held_out=False), draw("test", num_test, held_out=True)


def uses_tool(prompt: str, tool_fraction: float) -> bool:
    """Whether the cold start's episode of ``prompt`` calls the tool: True for a fixed ``tool_fraction``
    share of prompts, chosen by a hash of the prompt (independent of the held-out hash)."""
    digest = hashlib.blake2b(b"grpokit-calculator-tool:" + prompt.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < tool_fraction


def worked_solution(row: dict[str, Any]) -> str:
    """The policy's final answer: ``"<answer>29842</answer>"`` (EOS is appended at tokenization)."""
    return f"{ANSWER_OPEN}{_solution(row)}{ANSWER_CLOSE}"


def worked_episode(row: dict[str, Any]) -> list[tuple[str, bool]]:
    """The cold start's episode as ``(text, is_policy)`` segments.

    Rows with ``worked_tool_call`` (see :func:`make_calculator_splits`): the tool call, the observation
    :class:`CalculatorEnvironment` answers it with (computed by running it), then the answer::

        [('<tool_call>{"name": "calculator", "arguments": {"expression": "347*86"}}</tool_call>', True),
         ('<tool_response>29842</tool_response>', False),
         ('<answer>29842</answer>', True)]

    Other rows: ``[('<answer>29842</answer>', True)]``.
    """
    answer = worked_solution(row)
    if not row.get("worked_tool_call"):
        return [(answer, True)]
    expression = row.get("expression")
    if not isinstance(expression, str) or not expression:
        raise ValueError(f"a calculator row needs an 'expression' (like '347*86'), got {expression!r}")
    call = format_tool_call("calculator", {"expression": expression})
    env = CalculatorEnvironment()
    env.reset(row)
    turn = env.step(call)
    if not isinstance(turn.observation, str):
        raise ValueError("worked_episode writes plain-text episodes; the row's prompt must be a string")
    if turn.done or turn.info.get("tool_errors"):
        raise ValueError(f"the calculator could not evaluate the row's expression {expression!r}: {turn}")
    return [(call, True), (turn.observation, False), (answer, True)]


def _solution(row: dict[str, Any]) -> str:
    """The row's ``solution`` as a normalised integer string; ValueError when missing or not an integer."""
    solution = row.get("solution")
    try:
        return str(int(str(solution).strip()))
    except ValueError:
        raise ValueError(f"a calculator row needs an integer 'solution', got {solution!r}") from None


extract_answer = integer_answer
"""The integer in the last ``<answer>...</answer>``, normalised, or None
(:func:`grpokit.tasks.answers.integer_answer`)."""

calculator_exact_answer_reward = make_integer_answer_reward("calculator_exact_answer_reward")
"""1.0 when the integer in the last ``<answer>`` of the completion (the whole episode transcript, or chat
messages: the last one's content) equals the row's ``solution``, else 0.0 (TRL signature)."""
