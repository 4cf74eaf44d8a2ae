"""``grpokit eval``: a model on a built-in task's held-out split (or a file): greedy accuracy, and pass@k /
maj@k / mean@k when sampling."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tyro

from grpokit.cli.recipes import TYRO_MARKERS
from grpokit.cli.train_command import resolve_model, task_graders, task_splits

__all__ = ["EvalArgs", "eval_main", "run_eval"]


@dataclass
class EvalArgs:
    """Evaluate a model on a task's held-out split (or a file): greedy accuracy, optionally pass@k/maj@k."""

    model: str
    """A model directory or hub id, or ``tiny:<task>`` for the built-in cold-started tiny policy."""
    task: str = "arithmetic"
    """A built-in task whose held-out split and answer check are used."""
    eval_dataset: str | None = None
    """Held-out prompts from a local file instead of the task's split."""
    num_eval_examples: int | None = None
    """Held-out questions to generate for a built-in task."""
    task_seed: int = 0
    """Seed of the built-in task's question generator."""
    num_samples: int = 1
    """Samples per prompt; >1 reports pass@k, maj@k and mean@k with sampling at ``temperature``."""
    temperature: float = 1.0
    """Sampling temperature when num_samples > 1 (greedy otherwise)."""
    max_new_tokens: int = 64
    """Completion limit."""
    output: str | None = None
    """Write the result as JSON here."""


def run_eval(args: EvalArgs) -> dict[str, Any]:
    """Evaluate a model on held-out prompts; print (and optionally write) the metrics."""
    from transformers import AutoModelForCausalLM

    from grpokit.data import load_rows
    from grpokit.eval import evaluate_accuracy
    from grpokit.models import load_tokenizer

    path = resolve_model(args.model, seed=args.task_seed)
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = load_tokenizer(path)
    rows = (
        load_rows(args.eval_dataset, name="eval_dataset")
        if args.eval_dataset
        else task_splits(args.task, args)[1]
    )
    sampled = args.num_samples > 1
    result = evaluate_accuracy(
        model,
        tokenizer,
        rows,
        **task_graders(args.task),
        max_new_tokens=args.max_new_tokens,
        num_samples=args.num_samples,
        temperature=args.temperature if sampled else 0.0,
    )
    result = {k: v for k, v in result.items() if k != "completions"}
    print(json.dumps(result, indent=2))
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2))
    return result


def eval_main(argv: list[str]) -> int:
    """``grpokit eval [--option value ...]``; returns the exit status."""
    run_eval(tyro.cli(EvalArgs, args=argv, prog="grpokit eval", use_underscores=True, config=TYRO_MARKERS))
    return 0
