"""Math accuracy: the completion's final answer against the dataset's ``solution`` column, with math-verify.

    r_i = 1.0  if verify(parse(solution_i), parse(extract(completion_i)))
          0.0  if not, if no answer can be extracted, or if the check does not finish within ``timeout``
          None if the gold solution itself does not parse (the sample cannot be graded: not counted as 0)

Every parse/verify runs in a worker process with a hard time limit (see
:mod:`grpokit.rewards.isolation.verifier`), so adversarial answers (``9^{9^{9^9}}``, deeply nested
LaTeX, megabyte strings) return within ``timeout``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grpokit.data.chat import completion_texts
from grpokit.rewards.base import RewardFunc, column
from grpokit.rewards.extract import Extractor, get_extractor
from grpokit.rewards.isolation.verifier import MathVerifier, shared_verifier


def make_accuracy_reward(
    extract: str | Extractor = "auto",
    *,
    solution_column: str = "solution",
    timeout: float = 5.0,
    max_answer_chars: int = 1000,
    max_text_chars: int = 20000,
    max_workers: int | None = None,
    memory_mb: int | None = 2048,
    verifier: MathVerifier | None = None,
    name: str = "accuracy_reward",
) -> RewardFunc:
    """Build an accuracy reward ``fn(prompts, completions, completion_ids, **columns) -> list[float | None]``.

    Args:
        extract: how to find the final answer: ``"auto"``, ``"boxed"``, ``"answer_tag"``, ``"hash"``,
            ``"last_number"`` (see :mod:`grpokit.rewards.extract`), a callable ``str -> str | None``, or
            ``"math_verify"``: hand the last ``max_text_chars`` characters to math-verify's own extraction.
        solution_column: dataset column holding the gold answer (a bare answer or a full solution text).
        timeout: seconds allowed per check before it counts as wrong (hard limit, enforced by a kill).
        max_answer_chars: an extracted answer longer than this is wrong without being parsed.
        max_text_chars: longest gold solution graded (longer: None) and tail kept for ``"math_verify"``.
        max_workers, memory_mb: size and address-space limit of the shared worker pool.
        verifier: use this :class:`MathVerifier` instead of the shared one.
        name: ``__name__`` of the returned function (its metric name).
    """
    whole_text = extract == "math_verify"
    extractor = None if whole_text else get_extractor(extract)

    def answer_of(text: str) -> str | None:
        if extractor is None:
            return text[-max_text_chars:] or None
        answer = extractor(text)
        return answer if answer and len(answer) <= max_answer_chars else None

    def accuracy_reward(
        prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Sequence[Any] = (), **kwargs: Any
    ) -> list[float | None]:
        texts = completion_texts(completions)
        golds = column(kwargs, solution_column, len(texts), name)
        pool = verifier or shared_verifier(max_workers, memory_mb)
        rewards: list[float | None] = [0.0] * len(texts)
        pending: list[tuple[int, str, str]] = []
        for row, (gold, text) in enumerate(zip(golds, texts)):
            gold_text = "" if gold is None else str(gold)
            if not gold_text.strip() or len(gold_text) > max_text_chars:
                rewards[row] = None
                continue
            answer = answer_of(text)
            if answer is not None:
                pending.append((row, gold_text, answer))
            elif not pool.gold_parses(gold_text, timeout):
                rewards[row] = None
        checked = pool.check_many([(gold, answer) for _, gold, answer in pending], timeout)
        for (row, _, _), value in zip(pending, checked):
            rewards[row] = value
        return rewards

    accuracy_reward.__name__ = accuracy_reward.__qualname__ = name
    accuracy_reward.required_columns = (solution_column,)  # type: ignore[attr-defined]
    return accuracy_reward


accuracy_reward = make_accuracy_reward()
"""Default accuracy reward: ``extract="auto"``, column ``solution``, 5 s per check."""
