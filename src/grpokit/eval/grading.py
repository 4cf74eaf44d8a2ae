"""Grading evaluation completions: reward functions and/or an answer extractor, correctness against a
threshold, and the summary metrics (mean reward, accuracy, pass@k, mean@k, maj@k). Knows no model: it
grades completions however they were made (:func:`grpokit.eval.generate_completions`, or by hand)."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grpokit.core import combine_rewards
from grpokit.data.chat import as_completion, completion_text
from grpokit.data.loading import reward_columns
from grpokit.eval.metrics import maj_at_k, mean_at_k, mean_pass_at_k
from grpokit.rewards.extract import EXTRACTORS, Extractor
from grpokit.rewards.scoring import reward_names, reward_weights, score_completions

__all__ = [
    "EvalCompletions",
    "gold_answer",
    "grade_completions",
    "make_answer_match_reward",
    "resolve_extractor",
    "reward_weights_for",
    "validate_grading",
]


@dataclass
class EvalCompletions:
    """``k`` completions for each of P prompts, grouped by prompt (outer lists have P entries, inner k)."""

    texts: list[list[str]]
    """Decoded completions (special tokens skipped)."""
    token_ids: list[list[list[int]]]
    """Completion token ids; a completion that stopped ends with its EOS id."""
    truncated: list[list[bool]] = field(default_factory=list)
    """True where a completion hit ``max_new_tokens`` without an EOS (default: none truncated)."""
    backend: str | None = None
    """The generation backend that produced them (``fast`` / ``transformers``), None when built by hand."""
    columns: list[list[dict[str, Any]]] | None = None
    """Per completion, columns added to its row for the reward functions (multi-turn episodes:
    ``env_reward``, ``env_actions``, ...; ``grpokit.envs.episodes.episode_columns``)."""


def resolve_extractor(spec: str | Extractor | None) -> Extractor | None:
    """An answer extractor from ``answer_extractor``: None, a callable ``str -> str | None`` (as is), a name
    of :data:`grpokit.rewards.extract.EXTRACTORS` (boxed, answer_tag, hash, last_number, auto), or an import
    path ``package.module.function`` / ``package.module:function``. Anything else raises ValueError naming
    the option."""
    if spec is None or callable(spec):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"answer_extractor must be a name or an import path, got {type(spec).__name__}")
    if spec in EXTRACTORS:
        return EXTRACTORS[spec]
    module_name, _, attr = spec.partition(":") if ":" in spec else spec.rpartition(".")
    if not module_name or not attr:
        raise ValueError(
            f"answer_extractor: unknown extractor {spec!r}; choose one of {sorted(EXTRACTORS)} "
            "or give an import path package.module.function"
        )
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        message = f"answer_extractor {spec!r}: cannot import module {module_name!r} ({error})"
        raise ValueError(message) from error
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ValueError(f"answer_extractor {spec!r}: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"answer_extractor {spec!r} is a {type(target).__name__}, not a function")
    return target


def gold_answer(solution: Any, extractor: Extractor) -> str:
    """The reference answer of a row: ``extractor`` applied to its ``solution`` where that finds an answer
    (a GSM8K solution "... #### 72" gives "72" with ``hash``, a MATH one its last ``\\boxed{}``), else the
    solution itself; a stripped string."""
    text = str(solution)
    answer = extractor(text)
    return str(answer if answer is not None else text).strip()


def make_answer_match_reward(extractor: Extractor) -> Callable[..., list[float]]:
    """The reward used when only an answer extractor grades: 1.0 where the answer extracted from the
    completion, as a stripped string, equals the row's :func:`gold_answer`, else 0.0 (also when nothing is
    extracted). Metric name ``answer_match``."""

    def answer_match(
        prompts: Sequence[Any], completions: Sequence[Any], solution: Sequence[Any] | None = None, **_: Any
    ) -> list[float]:
        if solution is None:
            raise ValueError("answer_match needs a 'solution' column")
        answers = [extractor(completion_text(c)) for c in completions]
        return [
            float(a is not None and str(a).strip() == gold_answer(s, extractor))
            for a, s in zip(answers, solution)
        ]

    return answer_match


def validate_grading(
    rows: Sequence[Mapping[str, Any]],
    *,
    num_reward_funcs: int,
    extractor: Extractor | None,
    num_samples: int,
    temperature: float,
    reward_weights: Sequence[float] | None = None,
    pass_k: Sequence[int] = (),
) -> None:
    """Refuse, before any generation, what cannot be evaluated; each error names the option to change."""
    if not rows:
        raise ValueError("eval_dataset: no rows to evaluate")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if num_samples > 1 and temperature == 0:
        raise ValueError(
            f"num_samples={num_samples} needs temperature > 0: temperature=0 is greedy decoding, which gives "
            f"{num_samples} identical completions"
        )
    if num_reward_funcs == 0 and extractor is None:
        raise ValueError(
            "nothing to grade with: give reward_funcs (built-in names such as accuracy, or module.function "
            "paths) or an answer_extractor (compared with each row's 'solution')"
        )
    bad = [j for j in pass_k if not 1 <= j <= num_samples]
    if bad:
        raise ValueError(f"pass_k: every budget must be between 1 and num_samples={num_samples}, got {bad}")
    graders = num_reward_funcs or 1  # answer grading is one reward function (answer_match)
    if reward_weights is not None and len(reward_weights) != graders:
        raise ValueError(
            f"reward_weights has {len(reward_weights)} values but there are {graders} reward functions"
        )
    needs_solution = extractor is not None and (num_reward_funcs == 0 or num_samples > 1)
    missing = next((i for i, row in enumerate(rows) if row.get("solution") is None), None)
    if needs_solution and missing is not None:
        why = (
            "grading by answer (answer_extractor without reward_funcs)"
            if num_reward_funcs == 0
            else f"maj@{num_samples} (answer_extractor with num_samples > 1)"
        )
        raise ValueError(
            f"{why} compares the extracted answer with each row's 'solution' column, but eval_dataset row "
            f"{missing} has none (columns: {sorted(rows[missing])}); add the column or drop answer_extractor"
        )


def _mean(values: Iterable[float]) -> float | None:
    """Exactly rounded mean of the non-NaN values (None when there are none)."""
    kept = [v for v in values if not math.isnan(v)]
    return math.fsum(kept) / len(kept) if kept else None


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


def grade_completions(
    rows: Sequence[Mapping[str, Any]],
    completions: EvalCompletions,
    *,
    reward_funcs: Sequence[Callable[..., Any]] = (),
    reward_weights: Sequence[float] | None = None,
    answer_extractor: Extractor | None = None,
    correct_threshold: float = 1.0,
    pass_k: Sequence[int] = (),
    per_example: bool = False,
) -> dict[str, Any]:
    """Score P prompts' k completions each and summarise.

    The reward of a completion is the weighted sum over ``reward_funcs`` (TRL signature, the rows' other
    columns forwarded, checked like training rewards; ``None`` = does not apply and is skipped by the sum;
    weights default to 1). Without reward functions the reward is ``answer_match``
    (:func:`make_answer_match_reward`: extracted answer == ``solution``). A completion is **correct** when
    its reward is ``>= correct_threshold`` (a reward that is None for every function is never correct).

    Returns:

    * ``accuracy``: the mean over prompts of the fraction of a prompt's samples that are correct. With k = 1
      this is the fraction of prompts whose completion is correct; with k > 1 it equals ``mean@k``;
    * ``mean_reward``: mean over all P*k completions of the weighted reward (completions for which every
      function returned None left out; None when none is left); ``rewards/<name>/mean``: the same per
      reward function, unweighted;
    * with k > 1: ``pass@k``, the mean over prompts of the unbiased estimator of Chen et al. 2021,
      1 - C(n-c, k) / C(n, k) with n samples of which c are correct (with n = k: the fraction of prompts
      with at least one correct sample), and ``pass@j`` for every smaller budget j in ``pass_k`` (same
      estimator, n = k); ``mean@k``; and with an extractor ``maj@k`` (the fraction of prompts whose most
      frequent extracted answer, None casting no vote and ties going to the first seen, equals the
      row's :func:`gold_answer`; both stripped strings);
    * with an extractor, ``format_rate``: the fraction of completions with an extracted answer;
    * ``num_examples`` (P), ``num_samples`` (k), ``mean_completion_tokens`` (the EOS token counted),
      ``truncated_rate`` (fraction without EOS within the limit), ``correct_threshold``, ``reward_funcs``
      (metric names);
    * with ``per_example``: ``records``, per prompt ``prompt``, ``solution`` (if any), ``completions``,
      ``rewards`` (weighted, per completion), ``rewards_by_function``, ``correct``, ``completion_tokens``,
      ``truncated`` and with an extractor ``extracted``.
    """
    num_prompts, k = len(rows), len(completions.texts[0]) if completions.texts else 0
    if len(completions.texts) != num_prompts or any(len(t) != k for t in completions.texts) or k == 0:
        raise ValueError(f"expected the same number (>= 1) of completions for each of the {num_prompts} rows")
    funcs = list(reward_funcs) or ([make_answer_match_reward(answer_extractor)] if answer_extractor else [])
    if not funcs:
        raise ValueError("nothing to grade with: give reward_funcs or an answer_extractor")
    names = reward_names(funcs)
    extra = completions.columns or [[{}] * k for _ in rows]
    repeated = [{**row, **extra[p][j]} for p, row in enumerate(rows) for j in range(k)]
    flat_texts = [text for texts in completions.texts for text in texts]
    matrix, _ = score_completions(
        funcs,
        prompts=[row["prompt"] for row in repeated],
        completions=[as_completion(text, row["prompt"]) for row, text in zip(repeated, flat_texts)],
        completion_ids=[ids for per_row in completions.token_ids for ids in per_row],
        columns=reward_columns(repeated),
    )  # [P*k, F]
    weights = torch.tensor(reward_weights_for(reward_weights, names), dtype=torch.float32)
    combined = combine_rewards(matrix, weights).tolist()  # [P*k], NaN where no function applied
    flat_correct = [not math.isnan(r) and r >= correct_threshold for r in combined]
    correct = [flat_correct[p * k : (p + 1) * k] for p in range(num_prompts)]
    lengths = [len(ids) for per_row in completions.token_ids for ids in per_row]
    truncated = [t for per_row in completions.truncated for t in per_row] or [False] * len(lengths)

    result: dict[str, Any] = {
        "accuracy": mean_at_k(correct),
        "mean_reward": _mean(combined),
        **{f"rewards/{name}/mean": _mean(matrix[:, f].tolist()) for f, name in enumerate(names)},
        "num_examples": num_prompts,
        "num_samples": k,
        "correct_threshold": correct_threshold,
        "reward_funcs": names,
        "mean_completion_tokens": math.fsum(lengths) / len(lengths),
        "truncated_rate": sum(truncated) / len(truncated),
    }
    answers = None
    if answer_extractor is not None:
        answers = [[answer_extractor(text) for text in texts] for texts in completions.texts]
        result["format_rate"] = sum(a is not None for ans in answers for a in ans) / len(flat_texts)
    if k > 1:
        for budget in sorted({*pass_k, k}):
            result[f"pass@{budget}"] = mean_pass_at_k(correct, budget)
        result[f"mean@{k}"] = mean_at_k(correct)
        if answers is not None:
            votes = [[None if a is None else str(a).strip() for a in ans] for ans in answers]
            golds = [gold_answer(row["solution"], answer_extractor) for row in rows]
            result[f"maj@{k}"] = maj_at_k(votes, golds)
    if completions.backend is not None:
        result["generation_backend"] = completions.backend
    if per_example:
        result["records"] = _records(rows, completions, matrix, names, combined, correct, answers)
    return result


def reward_weights_for(weights: Sequence[float] | None, names: Sequence[str]) -> list[float]:
    """One weight per reward function (:func:`grpokit.rewards.reward_weights`, default 1.0 each); a length
    mismatch is an error naming ``reward_weights``."""
    if weights is not None and len(weights) != len(names):
        raise ValueError(
            f"reward_weights has {len(weights)} values but there are {len(names)} reward functions "
            f"({', '.join(names)})"
        )
    return reward_weights(weights, names, "reward_weights")


def _records(
    rows: Sequence[Mapping[str, Any]],
    completions: EvalCompletions,
    matrix: torch.Tensor,
    names: list[str],
    combined: list[float],
    correct: list[list[bool]],
    answers: list[list[str | None]] | None,
) -> list[dict[str, Any]]:
    k = len(completions.texts[0])
    per_function = matrix.tolist()  # [P*k, F]
    records = []
    for p, row in enumerate(rows):
        group = range(p * k, (p + 1) * k)
        record: dict[str, Any] = {"prompt": row["prompt"]}
        if "solution" in row:
            record["solution"] = row["solution"]
        record["completions"] = completions.texts[p]
        record["rewards"] = [_number(combined[i]) for i in group]
        record["rewards_by_function"] = {
            name: [_number(per_function[i][f]) for i in group] for f, name in enumerate(names)
        }
        record["correct"] = correct[p]
        record["completion_tokens"] = [len(ids) for ids in completions.token_ids[p]]
        record["truncated"] = completions.truncated[p] if completions.truncated else [False] * k
        if answers is not None:
            record["extracted"] = answers[p]
        records.append(record)
    return records
