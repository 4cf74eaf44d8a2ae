"""Process rewards behind one interface, and how they become (and combine with) token advantages.

A *process reward function* scores every step of every completion::

    fn(prompts, completions, steps, **columns) -> list[list[float] | None]

``steps[i]`` is the list of step strings of completion ``i`` (``split_steps`` with the run's delimiter);
the result has one list per completion with exactly one float per step, or ``None`` for a completion the
function does not apply to. ``columns`` are the dataset's other columns repeated per completion (as for
outcome reward functions), plus ``step_spans`` (the character spans of the steps in each completion). Two
sources implement it: rule-based step verifiers (plain functions, e.g.
``grpokit.data.tasks.chain.chain_step_reward``) and ``ProcessRewardModel`` (a neural PRM).

The trainer calls ``score_process`` once per generation batch and hands its result to
``grpokit.core.process_advantages``; ``combine_outcome_and_process`` mixes in outcome advantages.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grpokit.rewards.process.steps import (
    DEFAULT_STEP_DELIMITER,
    completion_text,
    split_steps,
    step_token_ends,
)

__all__ = [
    "ProcessRewardFunc",
    "ProcessScores",
    "combine_outcome_and_process",
    "process_reward_name",
    "resolve_process_reward_funcs",
    "score_process",
    "score_process_detailed",
]

ProcessRewardFunc = Callable[..., Sequence[Sequence[float] | None]]
"""``fn(prompts, completions, steps, **columns) -> list[list[float] | None]``, one float per step."""

# Built-in rule-based step verifiers, by name (resolved lazily: rewards does not import the tasks).
_BUILTIN = {
    "chain_steps": ("grpokit.data.tasks.chain", "chain_step_reward"),
    "chain_steps_local": ("grpokit.data.tasks.chain", "chain_step_reward_local"),
}


def process_reward_name(fn: Any) -> str:
    """The name used in metrics: ``__name__``, else ``name``, else the class name."""
    return getattr(fn, "__name__", None) or getattr(fn, "name", None) or type(fn).__name__


def resolve_process_reward_funcs(
    specs: Sequence[Any], *, delimiter: str = DEFAULT_STEP_DELIMITER, **prm_kwargs: Any
) -> list[ProcessRewardFunc]:
    """Turn config entries into process reward functions.

    Each entry is a callable (used as is), a built-in verifier name (``"chain_steps"``: strict prefix
    verifier of the chain task; ``"chain_steps_local"``: each line judged on its own), or a path to a saved
    process reward model (a token-classification checkpoint, loaded as ``ProcessRewardModel``; extra keyword
    arguments such as ``batch_size`` or ``device`` go to it).
    """
    out: list[ProcessRewardFunc] = []
    for spec in specs:
        if callable(spec):
            out.append(spec)
        elif isinstance(spec, str) and spec in _BUILTIN:
            import importlib

            module, attr = _BUILTIN[spec]
            out.append(getattr(importlib.import_module(module), attr))
        elif isinstance(spec, str):
            from grpokit.rewards.process.prm import ProcessRewardModel

            out.append(ProcessRewardModel(spec, delimiter=delimiter, **prm_kwargs))
        else:
            raise TypeError(
                f"process reward {spec!r}: expected a callable, a built-in name ({sorted(_BUILTIN)}) or a "
                "checkpoint path"
            )
    return out


@dataclass
class ProcessScores:
    """Everything ``score_process`` computed for one batch of N completions."""

    step_rewards: list[list[float]]
    """[N][S_i] weighted sum over the functions of each step's reward (empty when no function applies)."""
    step_ends: list[list[int]]
    """[N][S_i] token index (within the completion) of the last token of each step; [] when S_i is 0."""
    steps: list[list[str]]
    """[N][S_i'] the step strings (S_i' = S_i unless no function applied to completion i)."""
    per_function: dict[str, list[list[float] | None]] = field(default_factory=dict)
    """Each function's raw output, by name."""

    def metrics(self) -> dict[str, float]:
        """``process_rewards/<name>/mean`` (mean step reward over all scored steps), ``.../step_count``
        (mean steps per scored completion) and ``process_rewards/num_steps/mean`` (steps per completion)."""
        out: dict[str, float] = {}
        for name, rows in self.per_function.items():
            values = [v for row in rows if row is not None for v in row]
            scored = [row for row in rows if row is not None]
            out[f"process_rewards/{name}/mean"] = sum(values) / len(values) if values else math.nan
            out[f"process_rewards/{name}/step_count"] = (
                sum(len(r) for r in scored) / len(scored) if scored else math.nan
            )
        counts = [len(s) for s in self.steps]
        out["process_rewards/num_steps/mean"] = sum(counts) / len(counts) if counts else math.nan
        return out


def score_process_detailed(
    process_fns: Sequence[ProcessRewardFunc],
    prompts: Sequence[Any],
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]],
    tokenizer: Any,
    columns: dict[str, Sequence[Any]] | None = None,
    delimiter: str = DEFAULT_STEP_DELIMITER,
    *,
    weights: Sequence[float] | None = None,
) -> ProcessScores:
    """``score_process`` plus the step strings and each function's raw output (for metrics and logging)."""
    n = len(completions)
    if len(prompts) != n or len(completion_ids) != n:
        raise ValueError(
            f"prompts ({len(prompts)}), completions ({n}) and completion_ids ({len(completion_ids)}) "
            "must have the same length"
        )
    if not process_fns:
        raise ValueError("score_process needs at least one process reward function")
    if weights is None:
        weights = [1.0] * len(process_fns)
    if len(weights) != len(process_fns):
        raise ValueError(f"{len(weights)} process reward weights for {len(process_fns)} functions")
    columns = dict(columns or {})
    for key, values in columns.items():
        if len(values) != n:
            raise ValueError(f"column {key!r} has {len(values)} values for {n} completions")
    if "step_spans" in columns:
        raise ValueError("'step_spans' is reserved for the step spans that score_process passes")

    texts = [completion_text(c) for c in completions]
    spans = [split_steps(t, delimiter) for t in texts]
    steps = [[t[s:e] for s, e in sp] for t, sp in zip(texts, spans)]
    ends = [step_token_ends(t, ids, tokenizer, delimiter) for t, ids in zip(texts, completion_ids)]

    per_function: dict[str, list[list[float] | None]] = {}
    totals: list[list[float] | None] = [None] * n
    for fn, weight in zip(process_fns, weights):
        name = process_reward_name(fn)
        result = fn(list(prompts), list(completions), steps, step_spans=spans, **columns)
        rows = _check_output(name, result, steps)
        per_function[name] = rows
        for i, row in enumerate(rows):
            if row is None:
                continue
            base = totals[i] if totals[i] is not None else [0.0] * len(row)
            totals[i] = [b + weight * v for b, v in zip(base, row)]
    step_rewards = [row if row is not None else [] for row in totals]
    step_ends = [e if row is not None else [] for e, row in zip(ends, totals)]
    return ProcessScores(step_rewards, step_ends, steps, per_function)


def _check_output(name: str, result: Any, steps: list[list[str]]) -> list[list[float] | None]:
    if result is None or len(result) != len(steps):
        got = "None" if result is None else f"{len(result)} rows"
        raise ValueError(f"process reward {name!r} returned {got} for {len(steps)} completions")
    rows: list[list[float] | None] = []
    for i, (row, row_steps) in enumerate(zip(result, steps)):
        if row is None:
            rows.append(None)
            continue
        values = [float(v) for v in row]
        if len(values) != len(row_steps):
            raise ValueError(
                f"process reward {name!r}, completion {i}: "
                f"{len(values)} step rewards for {len(row_steps)} steps"
            )
        if any(not math.isfinite(v) for v in values):
            raise ValueError(f"process reward {name!r}, completion {i}: non-finite step reward in {values}")
        rows.append(values)
    return rows


def score_process(
    process_fns: Sequence[ProcessRewardFunc],
    prompts: Sequence[Any],
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]],
    tokenizer: Any,
    columns: dict[str, Sequence[Any]] | None = None,
    delimiter: str = DEFAULT_STEP_DELIMITER,
    *,
    weights: Sequence[float] | None = None,
) -> tuple[list[list[float]], list[list[int]]]:
    """Score every step of every completion; returns ``(step_rewards, step_ends)`` for
    ``grpokit.core.process_advantages``.

    - Steps come from ``split_steps(completion, delimiter)``; ``step_ends[i][j]`` is the index within
      ``completion_ids[i]`` of the token that ends step j (see ``step_token_ends``).
    - With several functions, a step's reward is the weighted sum (``weights``, default all 1) of the
      functions that apply to that completion. A completion no function applies to (all returned None), or
      with no steps at all, gets ``[]`` and ``[]``: it contributes nothing to its group's statistics and
      gets advantage 0 on every token.
    - ``completions`` are strings or chat messages (the last message's content is used); ``completion_ids``
      are the sampled ids (an EOS at the end is fine).
    """
    scores = score_process_detailed(
        process_fns, prompts, completions, completion_ids, tokenizer, columns, delimiter, weights=weights
    )
    return scores.step_rewards, scores.step_ends


def combine_outcome_and_process(
    outcome_adv: torch.Tensor,
    process_adv: torch.Tensor,
    mask: torch.Tensor,
    outcome_weight: float = 1.0,
    process_weight: float = 1.0,
) -> torch.Tensor:
    """Per-token advantages from both kinds of supervision: a weighted sum, masked. Returns [N, T] float32.

        A[i, t] = mask[i, t] * (outcome_weight * A_outcome[i] + process_weight * A_process[i, t])

    Each part is normalised within its group on its own first (``group_advantages`` over the outcome
    rewards, ``process_advantages`` over the pooled step rewards), so the weights set their relative scale.
    Note the process part sums the normalised rewards of every step at or after t, so early tokens of a
    long chain carry larger magnitudes than the outcome part; weight accordingly.
    outcome_adv: [N]; process_adv, mask: [N, T].
    """
    if outcome_adv.dim() != 1:
        raise ValueError(f"outcome_adv must be [N], got shape {tuple(outcome_adv.shape)}")
    if process_adv.dim() != 2 or process_adv.shape[0] != outcome_adv.shape[0]:
        raise ValueError(
            f"process_adv must be [N={outcome_adv.shape[0]}, T], got shape {tuple(process_adv.shape)}"
        )
    if mask.shape != process_adv.shape:
        raise ValueError(
            f"mask shape {tuple(mask.shape)} must equal process_adv shape {tuple(process_adv.shape)}"
        )
    outcome = outcome_adv.to(torch.float32)[:, None]  # [N, 1]
    combined = outcome_weight * outcome + process_weight * process_adv.to(torch.float32)  # [N, T]
    return combined * mask.to(torch.float32)  # [N, T]
