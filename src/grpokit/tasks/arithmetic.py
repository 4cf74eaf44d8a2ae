"""A built-in arithmetic task: column addition of multi-digit numbers, generated from a seed.

Prompt (a plain string, no chat markup)::

    347+285=

Completion the policy is trained to produce: column addition, one step per digit position from the units
up (the digits of that column, then ``+1`` when the previous column carried, then the column sum), then the
tagged answer, then the tokenizer's EOS token (appended at tokenization; not part of the text)::

    7+5=12,4+8+1=13,3+2+1=6<answer>632</answer>

Every step is a single-digit fact, so a tiny model can learn the procedure quickly; the answer is the last
column sum followed by the units digit of each lower column. Answers are exact integers. The train and
held-out splits never share a question.

Rewards are the library's own (:mod:`grpokit.rewards`): ``arithmetic_exact_answer_reward`` is
``make_accuracy_reward`` on the integer in the last ``<answer>`` tag, ``arithmetic_format_reward`` is
``make_format_reward`` with :data:`ARITHMETIC_FORMAT_PATTERN`.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any

from grpokit.rewards.format import make_format_reward
from grpokit.tasks.answers import integer_answer, make_integer_answer_reward

__all__ = [
    "ANSWER_CLOSE",
    "ANSWER_OPEN",
    "ARITHMETIC_FORMAT_PATTERN",
    "HELD_OUT_FRACTION",
    "arithmetic_exact_answer_reward",
    "arithmetic_format_reward",
    "extract_answer",
    "is_held_out",
    "make_arithmetic_splits",
    "worked_solution",
]

ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
HELD_OUT_FRACTION = 0.1

# One column step: "d+d(+d...)=s".
_STEP = r"\d(?:\+\d)+=\d+"
# Special-token markers (``<|endoftext|>``, ``<|pad|>``) left by decoding without skipping them.
_SPECIAL_MARKER = r"<\|[A-Za-z_]+\|>"
_TAGGED_ANSWER = rf"{re.escape(ANSWER_OPEN)}\d+{re.escape(ANSWER_CLOSE)}"
ARITHMETIC_FORMAT_PATTERN = rf"\s*{_STEP}(?:,{_STEP})*{_TAGGED_ANSWER}\s*(?:{_SPECIAL_MARKER}\s*)*"
"""The whole expected completion: steps separated by ``,``, the tagged answer, then only whitespace and
special-token markers. Linear-time: after each step the next character decides what follows."""


def make_arithmetic_splits(
    seed: int = 0,
    num_train: int = 20_000,
    num_test: int = 500,
    *,
    num_terms: int = 2,
    num_digits: int = 3,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Generate ``(train, test)`` rows from ``seed``; the same arguments always give the same rows.

    Each row: ``prompt`` (``"347+285="``), ``solution`` (the exact sum as a string, ``"632"``) and
    ``terms`` (the operands, ``[347, 285]``). Questions are distinct within a split. The two splits are
    disjoint whatever the seeds and sizes: a fixed ~10% of all questions (by a hash of the question text,
    see ``is_held_out``) may only appear in the test split, the rest only in the train split. Each split
    has its own random stream, so a smaller ``num_train`` (``num_test``) gives a prefix of a larger one.

    Difficulty: ``num_terms`` operands (>= 2), each with exactly ``num_digits`` digits (>= 1), uniform.
    """
    if num_terms < 2:
        raise ValueError(f"num_terms must be >= 2 (one addition at least), got {num_terms}")
    if num_digits < 1:
        raise ValueError(f"num_digits must be >= 1, got {num_digits}")
    low, high = (10 ** (num_digits - 1) if num_digits > 1 else 0), 10**num_digits - 1
    space = (high - low + 1) ** num_terms
    if num_train > space * (1 - HELD_OUT_FRACTION) / 2 or num_test > space * HELD_OUT_FRACTION / 2:
        raise ValueError(
            f"asked for {num_train} train and {num_test} held-out questions but only {space} exist at this "
            "difficulty; lower num_train/num_test or raise num_digits/num_terms"
        )

    def draw(stream: str, n: int, held_out: bool) -> list[dict[str, Any]]:
        rng = random.Random(f"grpokit-arithmetic-{stream}-{seed}")
        rows: list[dict[str, Any]] = []
        seen: set[str] = set()
        for _ in range(100 * n + 10_000):
            if len(rows) == n:
                break
            terms = [rng.randint(low, high) for _ in range(num_terms)]
            prompt = "+".join(map(str, terms)) + "="
            if prompt not in seen and is_held_out(prompt) == held_out:
                seen.add(prompt)
                rows.append({"prompt": prompt, "solution": str(sum(terms)), "terms": terms})
        if len(rows) < n:
            raise ValueError(f"could not draw {n} distinct {stream} questions at this difficulty")
        return rows

    return draw("train", num_train, held_out=False), draw("test", num_test, held_out=True)


def is_held_out(prompt: str) -> bool:
    """Whether a question belongs to the held-out part of the question space (a fixed ~10%, chosen by a
    hash of the question text, the same for every seed and split size)."""
    digest = hashlib.blake2b(prompt.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 1000 < HELD_OUT_FRACTION * 1000


def worked_solution(row: dict[str, Any]) -> str:
    """The completion the cold start is trained on: ``"7+5=12,4+8+1=13,3+2+1=6<answer>632</answer>"``.

    EOS is not included: it is a token, appended by whoever tokenizes the completion.
    """
    terms = [int(t) for t in row["terms"]]
    width = max(len(str(t)) for t in terms)
    digits = [str(t).zfill(width) for t in terms]
    steps, carry, units = [], 0, []
    for pos in range(width - 1, -1, -1):
        column = [d[pos] for d in digits]
        total = sum(map(int, column)) + carry
        steps.append("+".join(column) + (f"+{carry}" if carry else "") + f"={total}")
        if pos > 0:
            units.append(str(total % 10))
        carry = total // 10
    answer = str(total) + "".join(reversed(units))
    assert int(answer) == sum(terms), (answer, terms)
    return ",".join(steps) + f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


extract_answer = integer_answer
"""The integer in the last ``<answer>...</answer>``, normalised (``"051"`` -> ``"51"``), or None
(:func:`grpokit.tasks.answers.integer_answer`)."""

arithmetic_exact_answer_reward = make_integer_answer_reward("arithmetic_exact_answer_reward")
"""1.0 when the answer equals the row's ``solution``, else 0.0 (TRL signature): the library's
:func:`grpokit.rewards.make_accuracy_reward` (math-verify) reading the integer in the ``<answer>`` tag."""

arithmetic_format_reward = make_format_reward(
    ARITHMETIC_FORMAT_PATTERN, nonempty_groups=False, name="arithmetic_format_reward"
)
"""1.0 when the completion is exactly ``step(,step)*<answer>N</answer>``, each step a column sum
``d+d(+d...)=s`` with single digits, else 0.0 (:func:`grpokit.rewards.make_format_reward` with
:data:`ARITHMETIC_FORMAT_PATTERN`). Checks the shape only, not the arithmetic. Surrounding whitespace and
trailing special-token markers such as ``<|endoftext|>`` (decoding without ``skip_special_tokens``) are
allowed; anything else after ``</answer>`` fails."""
