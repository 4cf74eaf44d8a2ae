"""Answers of the built-in tasks, read and graded with :mod:`grpokit.rewards`.

Both tasks (arithmetic, chain) end a completion with ``<answer>N</answer>``, N an integer. Reading it:

    answer(completion) = str(int(t))  where t = grpokit.rewards.extract.extract_answer_tag(text)
                                       (the last <answer>...</answer>, stripped), if t is an integer
                         None         otherwise (no tag, unclosed tag, anything but an integer inside)

Grading it: :func:`make_integer_answer_reward` is :func:`grpokit.rewards.make_accuracy_reward` (math-verify
under a time limit, ``None`` for an unparseable gold) with this extractor. Only a bare integer is passed on
to math-verify: math-verify would also accept an expression of equal value (``<answer>347+285</answer>``
for ``347+285=``), and a policy that learns to copy the question into the tag would be paid for it.
"""

from __future__ import annotations

from grpokit.rewards import make_accuracy_reward
from grpokit.rewards.base import RewardFunc
from grpokit.rewards.extract import MAX_ANSWER_DIGITS, integer_answer

__all__ = ["MAX_ANSWER_DIGITS", "integer_answer", "make_integer_answer_reward"]


def make_integer_answer_reward(name: str) -> RewardFunc:
    """An accuracy reward (TRL signature, column ``solution``) that grades :func:`integer_answer` with
    math-verify: 1.0 right, 0.0 wrong or no integer answer, None when the gold does not parse."""
    return make_accuracy_reward(extract=integer_answer, name=name)
