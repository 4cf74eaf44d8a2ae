"""What both sides of the benchmark share: the workloads, the reward, the prompts, timing helpers.

Standard library only, so it imports in the TRL environment and in grpokit's alike.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass

PHASES = ("generate", "reward", "old_logps", "ref_logps", "policy_forward", "backward", "other")
"""Per-step phases reported by both sides. ``other``: step time not covered by the named phases (advantages,
padding, optimizer step, logging)."""


PRECISIONS = ("fp32", "bf16")
"""A side's compute precision: fp32, or bf16 autocast over fp32 weights (``bf16=True`` in TRL and grpokit)."""


def side_name(side: str) -> tuple[str, str]:
    """``trl``, ``grpokit``, ``trl-bf16``, ``grpokit-bf16`` -> (implementation, precision)."""
    impl, _, precision = side.partition("-")
    precision = precision or "fp32"
    if impl not in ("trl", "grpokit") or precision not in PRECISIONS:
        raise SystemExit(f"unknown side {side!r}: trl or grpokit, optionally -bf16 (e.g. trl-bf16)")
    return impl, precision


@dataclass(frozen=True)
class Workload:
    name: str
    num_prompts: int
    num_generations: int
    prompt_len: int
    max_new_tokens: int
    beta: float
    num_iterations: int
    learning_rate: float = 1e-6
    temperature: float = 1.0
    model: str = "tiny"
    """"tiny": the random Qwen2 of tiny_model.py, synthetic word prompts; "smollm2": SmolLM2-135M-Instruct
    (smollm2.py), chat prompts (then ``prompt_len`` is unused)."""
    eos: bool = False
    """Completions end at the model's EOS (real lengths); False: EOS is suppressed on both sides and every
    completion runs to ``max_new_tokens``."""
    prompts: str = "short"
    """SmolLM2's chat prompts: "short" (``QUESTIONS``: one-line questions) or "varied" (``VARIED_TASKS``:
    prompts from one line to a paragraph, answers from a number to a story)."""

    @property
    def batch(self) -> int:
        return self.num_prompts * self.num_generations


WORKLOADS = {
    # W0: a smoke test of the harness (seconds per side), not a measurement; mu 2 and beta > 0 run every pass
    "W0": Workload(
        "W0", num_prompts=2, num_generations=4, prompt_len=16, max_new_tokens=8, beta=0.04, num_iterations=2
    ),
    "W1": Workload(
        "W1", num_prompts=8, num_generations=8, prompt_len=48, max_new_tokens=128, beta=0.04, num_iterations=1
    ),
    "W2": Workload(
        "W2",
        num_prompts=2,
        num_generations=16,
        prompt_len=512,
        max_new_tokens=64,
        beta=0.04,
        num_iterations=2,
    ),
    "W3": Workload(
        "W3",
        num_prompts=8,
        num_generations=8,
        prompt_len=0,
        max_new_tokens=16,
        beta=0.0,
        num_iterations=1,
        model="smollm2",
    ),
    # W4: real lengths. EOS on, prompts and answers of very different lengths (see VARIED_TASKS)
    "W4": Workload(
        "W4",
        num_prompts=4,
        num_generations=8,
        prompt_len=0,
        max_new_tokens=256,
        beta=0.04,
        num_iterations=1,
        model="smollm2",
        eos=True,
        prompts="varied",
    ),
}

QUESTIONS = [
    "What is {a} + {b}? Answer with the number only.",
    "Name a fruit whose name starts with the letter {c}.",
    "Write one sentence about the number {a}.",
    "Is {a} larger than {b}? Explain briefly.",
]


PASSAGE = (
    "The lighthouse on the northern cape was built in 1874 after three ships were lost on the rocks in a "
    "single winter. Its keeper, a former sailor named Tomas, lived there with his daughter for thirty years. "
    "Every evening he climbed the ninety-two steps to light the lamp, and every morning he wrote the weather "
    "in a small green notebook. When the lamp was finally automated in 1952, the notebooks were given to the "
    "town library, where they are still read by students who study the climate of the coast."
)

VARIED_TASKS = [
    "What is {a} + {b}? Answer with the number only.",
    "Write a long story about a {animal} who wants to become a {job}. Give it a beginning, a middle and an "
    "end, with names for every character.",
    "Name a fruit whose name starts with the letter {c}.",
    "Read this passage:\n\n" + PASSAGE + "\n\nSummarize the passage in one sentence.",
    "Explain to a child, in several paragraphs, how a {thing} works.",
    "Is {a} larger than {b}? Answer yes or no.",
    "Read this passage:\n\n" + PASSAGE + "\n\nWrite ten questions a teacher could ask about it, and answer "
    "each of them.",
    "Give a synonym of the word '{word}'.",
]
"""W4's chat prompts: a prompt of one line or of a paragraph, an answer of a word or of a whole story, so that
completion lengths in one step spread from a few tokens to ``max_new_tokens`` (stated per run:
``lengths`` in each side's result)."""


def benchmark_rows(wl: Workload, num_rows: int, seed: int) -> list[dict]:
    """The workload's prompt rows: synthetic word prompts of ``prompt_len`` tokens (tiny model), or chat
    questions as conversational prompts (SmolLM2: ``QUESTIONS`` or ``VARIED_TASKS``)."""
    import random

    if wl.model == "tiny":
        from tiny_model import synthetic_prompts

        return [{"prompt": p} for p in synthetic_prompts(num_rows, wl.prompt_len, seed=seed)]
    rng = random.Random(seed)
    templates = VARIED_TASKS if wl.prompts == "varied" else QUESTIONS
    rows = []
    for k in range(num_rows):
        text = templates[k % len(templates)].format(
            a=rng.randrange(10, 1000), b=rng.randrange(10, 1000), c=chr(ord("A") + rng.randrange(26)),
            animal=rng.choice(["fox", "whale", "sparrow", "tortoise"]),
            job=rng.choice(["baker", "pilot", "painter", "doctor"]),
            thing=rng.choice(["bicycle", "rainbow", "refrigerator", "volcano"]),
            word=rng.choice(["happy", "quick", "large", "quiet"]),
        )  # fmt: skip
        rows.append({"prompt": [{"role": "user", "content": text}]})
    return rows


NUM_DATASET_PROMPTS = 64
"""Distinct synthetic prompts per workload; steps cycle through them."""


def run_arguments(description: str | None = None) -> argparse.ArgumentParser:
    """The options that name one run of a workload: model, workload, steps, warm-up steps, seed, output."""
    ap = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", required=True)
    ap.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    return ap


def side_arguments() -> argparse.ArgumentParser:
    """The command-line options every side (grpokit, TRL) takes; a side may add its own."""
    ap = run_arguments()
    ap.add_argument(
        "--precision", choices=PRECISIONS, default="fp32",
        help="fp32, or bf16: bf16=True (autocast over fp32 weights) on either side",
    )  # fmt: skip
    ap.add_argument(
        "--fixed-samples", default=None,
        help="replay the completions recorded in this file (fixed_samples.py) instead of sampling; the "
        "dataset is then read in order (shuffle_dataset=False), so each step trains on the recorded prompts",
    )  # fmt: skip
    return ap


LENGTHS: list[dict] = []
"""Per reward call (one per GRPO step on both sides): each completion's length in tokens and each distinct
prompt, as ``reward_fn`` saw them (``prompt_lengths`` turns the prompts into token counts), and a digest
of the step's completion ids (``completions_digest``)."""


def completions_digest(completion_ids) -> str:
    """A short hash of a step's completion token ids, in order: equal on two sides exactly when they trained
    on the same completions."""
    rows = [[int(t) for t in ids] for ids in completion_ids]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def reward_fn(prompts, completions, completion_ids, **kwargs) -> list[float]:
    """Cheap and deterministic: a function of the completion's token ids only (same on both sides). Records
    the step's lengths and its completions' digest in ``LENGTHS``."""
    distinct = []
    for prompt in prompts:
        if not distinct or distinct[-1] != prompt:
            distinct.append(prompt)
    LENGTHS.append(
        {
            "prompts": distinct,
            "completions": [len(ids) for ids in completion_ids],
            "digest": completions_digest(completion_ids),
        }
    )
    return [float(sum(ids) % 101) / 100.0 for ids in completion_ids]


def prompt_token_ids(tokenizer, prompt) -> list[int]:
    """A prompt's token ids as both sides encode it: a chat prompt through the tokenizer's chat template with
    the generation prompt, a text prompt through the tokenizer."""
    if isinstance(prompt, list):
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids  # (an encoding in transformers 5)
    else:
        ids = tokenizer(prompt)["input_ids"]
    return [int(t) for t in ids]


def step_lengths(tokenizer, warmup: int) -> list[dict]:
    """``LENGTHS`` of the timed steps with each distinct prompt as its number of tokens."""
    return [
        {
            "prompts": [len(prompt_token_ids(tokenizer, p)) for p in step["prompts"]],
            "completions": step["completions"],
            "digest": step["digest"],
        }
        for step in LENGTHS[warmup:]
    ]


class FixedSamples:
    """Completions recorded once (``fixed_samples.py``) and replayed on every side instead of sampling, so
    that both sides' training passes run on the same tokens: the step ratio then compares the same work.

    The file holds, per dataset row in order, its prompt's token ids and the ``num_generations`` completions
    recorded for it. A side asks with one row per completion, each group's rows contiguous (as both trainers
    order a batch); the n-th group of a prompt it asks for gets the n-th group recorded for that prompt (a
    prompt may occur in several rows of the dataset), so sides reading the dataset in order get the same
    completions at every step."""

    def __init__(self, path: str) -> None:
        with open(path) as f:
            recorded = json.load(f)
        self.path = path
        self.num_generations = recorded["num_generations"]
        self.groups: dict[tuple[int, ...], list[list[list[int]]]] = defaultdict(list)
        for row in recorded["rows"]:
            self.groups[tuple(row["prompt_ids"])].append(row["completion_ids"])
        self.used: dict[tuple[int, ...], int] = defaultdict(int)

    def completions(self, prompt_ids) -> list[list[int]]:
        """The completions for ``prompt_ids``, one row per completion."""
        keys = [tuple(int(t) for t in ids) for ids in prompt_ids]
        out, position = [], 0
        for k, key in enumerate(keys):
            if k and key == keys[k - 1] and position + 1 < self.num_generations:
                position += 1
            else:  # a new group: its prompt's next recorded group
                position, group = 0, self.used[key]
                if group >= len(self.groups.get(key, [])):
                    raise KeyError(
                        f"{self.path}: no recorded group left for row {k}'s prompt ({len(key)} tokens; "
                        f"{len(self.groups.get(key, []))} recorded): record as many steps as the run takes"
                    )
                self.used[key] += 1
            out.append(self.groups[key][self.used[key] - 1][position])
        return out


def length_summary(values: list[int]) -> dict:
    """min, median, p90, max and the sum of a list of lengths."""
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    median = ordered[len(ordered) // 2] if len(ordered) % 2 else (
        (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2]) / 2
    )  # fmt: skip
    return {"min": ordered[0], "median": median, "p90": p90, "max": ordered[-1], "sum": sum(ordered)}


def print_operator_time(events, kinds: dict, rest: str, top: int = 0, indent: int = 2) -> None:
    """Print a ``torch.profiler`` run's operators' own CPU time summed by kind (``kinds``: kind -> operator
    names; every other operator counts as ``rest``), then its ``top`` operators with their calls.
    ``events``: ``prof.key_averages()``."""
    own = {event.key: event.self_cpu_time_total / 1e6 for event in events}
    total = sum(own.values())
    by_kind = {kind: sum(own.get(name, 0.0) for name in names) for kind, names in kinds.items()}
    by_kind[rest] = total - sum(by_kind.values())
    pad = " " * indent
    print(f"{pad}(operators' own CPU time {total:.2f} s)")
    for kind, spent in by_kind.items():
        print(f"{pad}{kind:26s} {spent:6.2f} s  {spent / total:5.1%}")
    for event in sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]:
        spent = event.self_cpu_time_total / 1e6
        print(f"{pad}  {event.key:56s} {spent:6.2f} s  {spent / total:5.1%}  {event.count:8d} calls")


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class PhaseTimer:
    """Accumulates wall time per phase; ``steps`` holds one dict per finished GRPO step."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []
        self._step_start: float | None = None

    @contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.current[name] += time.perf_counter() - start

    def start_step(self) -> None:
        self.current = defaultdict(float)
        self._step_start = time.perf_counter()

    def end_step(self) -> None:
        total = time.perf_counter() - self._step_start
        row = {p: self.current.get(p, 0.0) for p in PHASES if p != "other"}
        row["other"] = max(0.0, total - sum(row.values()))
        row["step"] = total
        self.steps.append(row)


def write_result(
    path: str, side: str, workload: Workload, timer: PhaseTimer, warmup: int, extra: dict
) -> None:
    result = {
        "side": side,
        "workload": asdict(workload),
        "warmup_steps": warmup,
        "steps": timer.steps[warmup:],
        "warmup": timer.steps[:warmup],
        "peak_rss_mib": peak_rss_mib(),
        "threads": int(os.environ.get("OMP_NUM_THREADS", "0") or 0),
        **extra,
    }
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
