"""Process rewards behind one interface: resolving them, and scoring every step of every completion.

A *process reward function* (:data:`grpokit.rewards.base.ProcessRewardFunc`) scores every step::

    fn(prompts, completions, steps, **columns) -> list[list[float] | None]

``steps[i]`` is the list of step strings of completion ``i`` (``split_steps`` with the run's delimiter);
the result has one list per completion with exactly one float per step, or ``None`` for a completion the
function does not apply to. ``columns`` are the dataset's other columns repeated per completion (as for
outcome reward functions), plus ``step_spans`` (the character spans of the steps in each completion). Two
sources implement it: rule-based step verifiers (plain functions, e.g.
``grpokit.tasks.chain.chain_step_reward``) and ``ProcessRewardModel`` (a neural PRM).

The trainer calls :func:`score_process` once per generation batch and hands ``step_rewards`` and
``step_ends`` to ``grpokit.core.process_advantages``. Failures follow the outcome rewards' policy
(:mod:`grpokit.rewards.scoring`, ``reward_failure``): a function that raises, returns the wrong number of
rows, the wrong number of step rewards or a non-finite one raises :class:`RewardFunctionError` naming it and
the completion, or (``on_error="none"``) counts as a failure and applies to none of those completions.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from grpokit.data.chat import completion_text
from grpokit.rewards.base import ProcessRewardFunc
from grpokit.rewards.process_rewards.steps import DEFAULT_STEP_DELIMITER, split_steps, step_token_ends
from grpokit.rewards.scoring import (
    ON_ERROR,
    RewardFunctionError,
    call_reward_functions,
    checked_outputs,
    reward_names,
)

__all__ = ["ProcessScores", "resolve_process_reward_funcs", "score_process"]

# Built-in rule-based step verifiers, by name (resolved lazily: rewards does not import the tasks).
_BUILTIN = {
    "chain_steps": ("grpokit.tasks.chain", "chain_step_reward"),
    "chain_steps_local": ("grpokit.tasks.chain", "chain_step_reward_local"),
}


def check_process_reward_specs(specs: Sequence[Any]) -> None:
    """Each name is a built-in verifier or an existing model directory (checked without loading it): an
    InputError naming ``process_reward_funcs`` otherwise."""
    from grpokit.data.integrity import InputError, check_model_dir

    for spec in specs:
        if not isinstance(spec, (str, os.PathLike)) or spec in _BUILTIN:
            continue  # (anything else but a callable is refused by resolve_process_reward_funcs)
        if isinstance(spec, (str, os.PathLike)) and os.path.isdir(os.fspath(spec)):
            check_model_dir(os.fspath(spec), "process_reward_funcs")
            continue
        raise InputError(
            f"process_reward_funcs: {spec!r} is not a built-in verifier "
            f"({', '.join(sorted(_BUILTIN))}) or a process-reward-model directory"
        )


def resolve_process_reward_funcs(
    specs: Sequence[Any], *, delimiter: str = DEFAULT_STEP_DELIMITER, **prm_kwargs: Any
) -> list[ProcessRewardFunc]:
    """Turn config entries into process reward functions.

    Each entry is a callable (used as is), a built-in verifier name (``"chain_steps"``: strict prefix
    verifier of the chain task; ``"chain_steps_local"``: each line judged on its own), or a path to a saved
    process reward model (a token-classification checkpoint, loaded as ``ProcessRewardModel``; extra keyword
    arguments such as ``batch_size`` or ``device`` go to it).
    """
    check_process_reward_specs(specs)
    out: list[ProcessRewardFunc] = []
    for spec in specs:
        if callable(spec):
            out.append(spec)
        elif isinstance(spec, str) and spec in _BUILTIN:
            module, attr = _BUILTIN[spec]
            out.append(getattr(importlib.import_module(module), attr))
        elif isinstance(spec, str):
            from grpokit.rewards.process_rewards.prm import ProcessRewardModel

            out.append(ProcessRewardModel(spec, delimiter=delimiter, **prm_kwargs))
        else:
            raise TypeError(
                f"process reward {spec!r}: expected a callable, a built-in name ({sorted(_BUILTIN)}) or a "
                "checkpoint path"
            )
    return out


@dataclass
class ProcessScores:
    """Everything :func:`score_process` computed for one batch of N completions."""

    step_rewards: list[list[float]]
    """[N][S_i] weighted sum over the functions of each step's reward (empty when no function applies)."""
    step_ends: list[list[int]]
    """[N][S_i] token index (within the completion) of the last token of each step; [] when S_i is 0."""
    steps: list[list[str]]
    """[N][S_i'] the step strings (S_i' = S_i unless no function applied to completion i)."""
    per_function: dict[str, list[list[float] | None]] = field(default_factory=dict)
    """Each function's checked output, by its unique metric name (None where it did not apply or failed)."""
    failures: dict[str, int] = field(default_factory=dict)
    """Failed completions per function (``on_error="none"``), by the same names."""

    def metrics(self) -> dict[str, float]:
        """``process_rewards/<name>/mean`` (mean step reward over all scored steps), ``.../step_count``
        (mean steps per scored completion), ``.../failures`` and ``process_rewards/num_steps/mean`` (steps
        per completion)."""
        out: dict[str, float] = {}
        for name, rows in self.per_function.items():
            values = [v for row in rows if row is not None for v in row]
            scored = [row for row in rows if row is not None]
            out[f"process_rewards/{name}/mean"] = sum(values) / len(values) if values else math.nan
            out[f"process_rewards/{name}/step_count"] = (
                sum(len(r) for r in scored) / len(scored) if scored else math.nan
            )
            out[f"process_rewards/{name}/failures"] = float(self.failures.get(name, 0))
        counts = [len(s) for s in self.steps]
        out["process_rewards/num_steps/mean"] = sum(counts) / len(counts) if counts else math.nan
        return out


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
    on_error: str = "raise",
    timeout: float | None = None,
) -> ProcessScores:
    """Score every step of every completion.

    - Steps come from ``split_steps(completion, delimiter)``; ``step_ends[i][j]`` is the index within
      ``completion_ids[i]`` of the token that ends step j (see ``step_token_ends``).
    - With several functions, a step's reward is the weighted sum (``weights``, default all 1) of the
      functions that apply to that completion. A completion no function applies to (all returned None, or
      failed), or with no steps at all, gets ``[]`` and ``[]``: it contributes nothing to its group's
      statistics and gets advantage 0 on every token.
    - ``completions`` are strings or chat messages (the last message's content is used); ``completion_ids``
      are the sampled ids (an EOS at the end is fine). ``on_error``: the failure policy (module docstring);
      ``timeout``: seconds each call may take (None: unbounded), a slower call failing under it.
    """
    n = len(completions)
    if len(prompts) != n or len(completion_ids) != n:
        raise ValueError(
            f"prompts ({len(prompts)}), completions ({n}) and completion_ids ({len(completion_ids)}) "
            "must have the same length"
        )
    if not process_fns:
        raise ValueError("score_process needs at least one process reward function")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    weights = [1.0] * len(process_fns) if weights is None else list(weights)
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
    kwargs = {"prompts": list(prompts), "completions": list(completions), "steps": steps, "step_spans": spans}
    outcomes = call_reward_functions(process_fns, {**kwargs, **columns}, timeout)

    scores = ProcessScores([], [], steps)
    totals: list[list[float] | None] = [None] * n
    for name, outcome, weight in zip(reward_names(process_fns), outcomes, weights):

        def check_row(row: int, value: Any, name: str = name) -> list[float] | None:
            return _step_values(name, row, value, len(steps[row]))

        rows, scores.failures[name] = checked_outputs(name, outcome, n, check_row, on_error)
        scores.per_function[name] = rows
        for i, row in enumerate(rows):
            if row is not None:
                base = totals[i] if totals[i] is not None else [0.0] * len(row)
                totals[i] = [b + weight * v for b, v in zip(base, row)]
    scores.step_rewards = [row if row is not None else [] for row in totals]
    scores.step_ends = [e if row is not None else [] for e, row in zip(ends, totals)]
    return scores


def _step_values(name: str, row: int, value: Any, num_steps: int) -> list[float] | None:
    """One completion's step rewards as floats, one per step (None stays None); RewardFunctionError else."""
    if value is None:
        return None
    try:
        values = [float(v) for v in value]
    except (TypeError, ValueError):
        expected = "expected one float per step"
        raise RewardFunctionError(name, f"returned {value!r}; {expected}", row, value) from None
    if len(values) != num_steps:
        raise RewardFunctionError(name, f"{len(values)} step rewards for {num_steps} steps", row, value)
    if any(not math.isfinite(v) for v in values):
        raise RewardFunctionError(name, f"non-finite step reward in {values}", row, value)
    return values
