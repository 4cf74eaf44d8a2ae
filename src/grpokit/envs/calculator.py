"""The calculator environment: a safe arithmetic evaluator as the policy's one tool.

:func:`calculator` parses the expression with :mod:`ast` and evaluates only numbers and arithmetic (never
``eval``). :class:`CalculatorEnvironment` offers it through :class:`~grpokit.envs.tools.ToolEnvironment`
and pays 1.0 for a final answer ``<answer>N</answer>`` equal to the row's ``solution``. An episode of the
calculator task (:mod:`grpokit.tasks.calculator`)::

    prompt   347*86=
    policy   <tool_call>{"name": "calculator", "arguments": {"expression": "347*86"}}</tool_call>
    env      <tool_response>29842</tool_response>
    policy   <answer>29842</answer>                      -> reward 1.0, done
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from grpokit.envs.tools import ToolEnvironment
from grpokit.rewards.extract import integer_answer

__all__ = ["MAX_EXPONENT", "MAX_EXPRESSION_CHARS", "MAX_RESULT_DIGITS", "CalculatorEnvironment", "calculator"]

MAX_EXPRESSION_CHARS = 200
"""Longer expressions are refused before parsing."""
MAX_RESULT_DIGITS = 100
"""Every intermediate and final value must be below ``10**MAX_RESULT_DIGITS`` in absolute value."""
MAX_EXPONENT = 1000
"""``a ** b`` with ``|b|`` above this is refused before it is computed."""
_LIMIT = 10**MAX_RESULT_DIGITS

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_REFUSED = {
    ast.Name: "names",
    ast.Call: "function calls",
    ast.Attribute: "attribute access",
    ast.Subscript: "indexing",
    ast.Compare: "comparisons",
    ast.BoolOp: "boolean operators",
    ast.Lambda: "lambdas",
}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: Numbers combined with + - * / // % ** and parentheses, e.g. "347*86".

    Returns:
        The result: an integer without ".0" ("29842"), otherwise a decimal ("0.5").
    """
    if not isinstance(expression, str):
        raise ValueError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(
            f"expression too long ({len(expression)} characters, at most {MAX_EXPRESSION_CHARS})"
        )
    if not expression.strip():
        raise ValueError("empty expression")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"not an arithmetic expression: {err.msg}") from None
    except (RecursionError, MemoryError):
        raise ValueError("expression nested too deeply") from None
    try:
        value = _evaluate(tree.body)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except OverflowError:
        raise ValueError(f"number too large (at most {MAX_RESULT_DIGITS} digits)") from None
    except RecursionError:
        raise ValueError("expression nested too deeply") from None
    return _format(value)


def _evaluate(node: ast.AST) -> int | float:
    """The value of one node of an arithmetic expression; ValueError for anything else."""
    if isinstance(node, ast.Constant):
        if type(node.value) not in (int, float):
            raise ValueError(f"only numbers are allowed, got {node.value!r}")
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _checked(_BINARY[type(node.op)](left, right))
    what = _REFUSED.get(type(node), f"{type(node).__name__} ({ast.unparse(node)[:40]!r})")
    if isinstance(node, ast.Name):
        what = f"names ({node.id!r})"
    raise ValueError(f"{what} not allowed: only numbers, + - * / // % ** and parentheses")


def _check_power(base: int | float, exponent: int | float) -> None:
    """Refuse ``base ** exponent`` before computing it when the exponent or the result would be too big."""
    if abs(exponent) > MAX_EXPONENT:
        raise ValueError(f"exponent too large ({exponent}, at most {MAX_EXPONENT})")
    if base < 0 and isinstance(exponent, float) and not exponent.is_integer():
        raise ValueError("a negative number to a fractional power is not a real number")
    if abs(base) > 1 and exponent > 0 and exponent * math.log10(abs(base)) >= MAX_RESULT_DIGITS:
        raise ValueError(f"number too large (at most {MAX_RESULT_DIGITS} digits)")


def _checked(value: Any) -> int | float:
    """``value`` when it is a finite real number below the size limit."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"not a real number: {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"number too large (at most {MAX_RESULT_DIGITS} digits)")
    if abs(value) >= _LIMIT:
        raise ValueError(f"number too large (at most {MAX_RESULT_DIGITS} digits)")
    return value


def _format(value: int | float) -> str:
    """``"29842"`` for integers and integer-valued floats, ``repr`` of other floats (``"0.5"``)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class CalculatorEnvironment(ToolEnvironment):
    """The policy may call ``calculator(expression)``; its turn without a tool call ends the episode, with
    reward 1.0 when the integer in its last ``<answer>...</answer>`` equals the row's ``solution``, else
    0.0 (no answer, not an integer, wrong)."""

    def __init__(self, timeout: float = 5.0):
        super().__init__([calculator], timeout=timeout)
        self._solution: str | None = None

    def reset(self, row: dict[str, Any]) -> None:
        """Start an episode on ``row``; it needs an integer ``solution``."""
        super().reset(row)
        solution = self.row.get("solution")
        if solution is None:
            raise ValueError("the calculator environment needs rows with a 'solution' (an integer)")
        try:
            self._solution = str(int(str(solution).strip()))
        except ValueError:
            raise ValueError(f"the row's solution must be an integer, got {solution!r}") from None

    def final_reward(self, action: str) -> float | None:
        """1.0 when the last ``<answer>`` of ``action`` holds the row's solution, else 0.0."""
        if self._solution is None:
            raise RuntimeError("CalculatorEnvironment.final_reward before reset(row)")
        return 1.0 if integer_answer(action) == self._solution else 0.0
