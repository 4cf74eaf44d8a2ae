"""What the policy writes, in the log (a step hook): ``completions.jsonl`` (``log_completions``) and a
console print of a few samples (``num_completions_to_print``), at the steps whose metrics are logged (TRL's
two option names).

One JSON line per completion of the step's whole batch (all processes)::

    {"step": 3, "prompt": "347+285=", "completion": "7+5=12,...<answer>632</answer>",
     "rewards": {"arithmetic_exact_answer_reward": 1.0, "arithmetic_format_reward": 1.0},
     "reward": 1.1, "advantage": 0.84}

``rewards`` holds each function's value (null where it returned None), ``reward`` the weighted sum the
advantage was computed from, ``advantage`` the group-relative (outcome) advantage of the completion, and
``extra`` (when a reward function called TRL's ``log_extra``) the logged columns' values.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from grpokit.data.images import has_images, image_names
from grpokit.data.records import append_jsonl, json_number
from grpokit.rollout.records import Samples, Scores

__all__ = ["CompletionLog", "completion_records"]

IMAGES_KEY = "\x00images"
"""Where a completion's image names ride with its columns through the gather (no reward's column name)."""


def completion_records(
    prompts: Sequence[Any],
    completions: Sequence[str],
    reward_names: Sequence[str],
    rewards: torch.Tensor,
    combined: torch.Tensor,
    advantages: torch.Tensor,
    kept: torch.Tensor | None = None,
) -> list[dict[str, Any]]:
    """One record per completion. rewards [N, F] (NaN = None), combined [N], advantages [N]; with ``kept``
    ([N] bool, dynamic sampling) the rows of dropped groups get ``"kept": false``."""
    n = len(completions)
    if not (len(prompts) == n == rewards.shape[0] == combined.shape[0] == advantages.shape[0]):
        sizes = f"{len(prompts)} prompts, {n} completions, {rewards.shape[0]} reward rows"
        raise ValueError(f"completion_records: sizes differ ({sizes})")
    rewards, combined, advantages = rewards.cpu().tolist(), combined.cpu().tolist(), advantages.cpu().tolist()
    records = [
        {
            "prompt": prompt,
            "completion": text,
            "rewards": {name: json_number(v, 6) for name, v in zip(reward_names, row)},
            "reward": json_number(total, 6),
            "advantage": json_number(advantage, 6),
        }
        for prompt, text, row, total, advantage in zip(prompts, completions, rewards, combined, advantages)
    ]
    if kept is not None:
        for record, keep in zip(records, kept.tolist()):
            if not keep:
                record["kept"] = False
    return records


class CompletionLog:
    """Writes ``<output_dir>/completions.jsonl`` and/or prints samples at the logged steps. Every process
    takes part (the batch's completions are gathered in process order); only ``enabled`` (the main
    process) writes or prints.

    ``is_logged(step)``: whether a step's metrics are logged. ``gather``: collects a list from every process
    (None with one process).
    """

    def __init__(
        self,
        output_dir: str | Path,
        write: bool,
        num_to_print: int | None,
        *,
        reward_names: Sequence[str],
        is_logged: Callable[[int], bool],
        gather: Callable[[list[Any]], list[Any]] | None = None,
        enabled: bool = True,
        log_images: bool = True,
    ) -> None:
        self.path = Path(output_dir) / "completions.jsonl"
        self.write = write
        self.num_to_print = num_to_print or 0
        self.reward_names = list(reward_names)
        self.is_logged = is_logged
        self.gather = gather
        self.enabled = enabled
        self.log_images = log_images  # log_multimodal: name each record's images (data.images.image_names)
        self.last: list[dict[str, Any]] = []
        """The records of the last logged step (every process's), as written."""

    @property
    def wanted(self) -> bool:
        """Whether completions are logged at all (the same answer on every process)."""
        return self.write or self.num_to_print > 0

    def record(self, step: int, samples: Samples, scores: Scores) -> None:
        """At a logged step: every process's completions with their rewards and advantages."""
        if not (self.wanted and self.is_logged(step)):
            return
        extra = samples.extra or {}
        columns = [{name: values[i] for name, values in extra.items()} for i in range(len(samples.texts))]
        if self.log_images and samples.images is not None:  # the images each completion's prompt showed
            for cols, row in zip(columns, samples.rows):
                if has_images(row):
                    cols[IMAGES_KEY] = image_names(row)
        triples = [
            (row["prompt"], text, cols) for row, text, cols in zip(samples.rows, samples.texts, columns)
        ]
        if self.gather is not None:
            triples = self.gather(triples)  # every process's, in process order: the order of the scores
        records = completion_records(
            [p for p, _, _ in triples],
            [t for _, t, _ in triples],
            self.reward_names,
            scores.rewards,
            scores.combined,
            scores.advantages,
            scores.kept,
        )
        for record, (_, _, cols) in zip(records, triples):
            if IMAGES_KEY in cols:
                record["images"] = cols.pop(IMAGES_KEY)
            if cols:  # the reward functions' log_extra columns
                record["extra"] = cols
        self.last = records
        self.log(step, records)

    def log(self, step: int, records: list[dict[str, Any]]) -> None:
        if not self.enabled:
            return
        if self.write:
            append_jsonl(self.path, ({"step": step, **record} for record in records))
        for record in records[: self.num_to_print]:
            tqdm.write(_format(step, record))


def _format(step: int, record: dict[str, Any]) -> str:
    prompt = record["prompt"] if isinstance(record["prompt"], str) else json.dumps(record["prompt"])
    scores = ", ".join(f"{name} {value}" for name, value in record["rewards"].items())
    return (
        f"[step {step}] reward {record['reward']} (advantage {record['advantage']}; {scores})\n"
        f"  prompt:     {prompt!r}\n  completion: {record['completion']!r}"
    )
