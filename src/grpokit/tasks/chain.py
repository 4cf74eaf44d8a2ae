"""A built-in multi-step task whose every step can be checked by rule: chained arithmetic.

Prompt: a start value and operations applied left to right, then a newline::

    17 +8 *2 -5

Completion: one line per operation (``<value><op><operand>=<result>``), then the tagged answer; EOS is a
token the tokenizer appends, not part of the text::

    17+8=25
    25*2=50
    50-5=45
    <answer>45</answer>

With the default newline step delimiter each line is one step (``num_ops + 1`` steps, the answer line
included). Every character is printable ASCII or a newline, and ``<answer>``/``</answer>`` are tags of
``grpokit.models.tiny.build_char_tokenizer``, so a character-level tokenizer covers the task. Values never go
negative (a subtraction never exceeds the running value) and never exceed ``max_value`` (a multiplication
that would is redrawn).

Rewards:

- ``chain_outcome_reward``: the usual outcome reward, 1.0 when the last ``<answer>`` holds the exact result
  (``grpokit.rewards.make_accuracy_reward`` reading a bare integer, see ``answers.py``).
- ``chain_step_reward`` (process reward, strict "prefix" rule): step k is 1.0 when it is exactly right --
  line k < num_ops writes ``v_k op_k = v_{k+1}`` with the true running value v_k, the k-th operation and
  the true result; line ``num_ops`` is ``<answer>v_final</answer>`` -- and every step before it was right.
  After the first wrong step, every later step is 0.0 (the Math-Shepherd convention: a step is good only if
  the solution is still on track). Extra lines and missing operations are wrong.
- ``chain_step_reward_local`` ("local" rule): each line judged on its own: the right operation, applied to
  the previous line's written result (the start value for the first line), with correct arithmetic; the
  answer line is right when it repeats the last written result. An early slip does not condemn later,
  internally consistent steps; the outcome reward is what catches the wrong final answer.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from typing import Any

from grpokit.tasks.answers import integer_answer, make_integer_answer_reward

__all__ = [
    "ANSWER_CLOSE",
    "ANSWER_OPEN",
    "apply_op",
    "chain_outcome_reward",
    "chain_step_reward",
    "chain_step_reward_local",
    "chain_values",
    "corrupt_solution",
    "extract_chain_answer",
    "is_held_out",
    "label_chain_samples",
    "make_chain_policy_rm_samples",
    "make_chain_rm_samples",
    "make_chain_splits",
    "make_chain_step_verifier",
    "worked_solution",
]

ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
HELD_OUT_FRACTION = 0.1
_LINE_RE = re.compile(r"\s*(-?\d+)([+\-*])(\d+)=(-?\d+)\s*")
_ANSWER_LINE_RE = re.compile(rf"\s*{re.escape(ANSWER_OPEN)}\s*(-?\d+)\s*{re.escape(ANSWER_CLOSE)}\s*")
# Special-token markers left by decoding without skip_special_tokens (``<|endoftext|>``).
_SPECIAL_RE = re.compile(r"<\|[A-Za-z_]+\|>")


def apply_op(value: int, operation: str) -> int:
    """``apply_op(25, "*2") == 50``. An operation is ``+n``, ``-n`` or ``*n``."""
    op, operand = operation[0], int(operation[1:])
    if op == "+":
        return value + operand
    if op == "-":
        return value - operand
    if op == "*":
        return value * operand
    raise ValueError(f"unknown operation {operation!r}")


def chain_values(start: int, operations: Sequence[str]) -> list[int]:
    """Running values ``[v_0 = start, v_1, ..., v_n]``."""
    values = [int(start)]
    for operation in operations:
        values.append(apply_op(values[-1], operation))
    return values


def _draw_question(
    rng: random.Random,
    num_ops: int,
    max_start: int,
    max_operand: int,
    max_factor: int,
    max_value: int,
    ops: str,
) -> dict[str, Any]:
    start = rng.randint(1, max_start)
    value, operations = start, []
    while len(operations) < num_ops:
        op = rng.choice(ops)
        if op == "+":
            operand = rng.randint(1, max_operand)
        elif op == "-":
            if value < 1:
                continue
            operand = rng.randint(1, min(max_operand, value))
        else:
            operand = rng.randint(2, max_factor)
        new = apply_op(value, f"{op}{operand}")
        if new > max_value:
            continue
        operations.append(f"{op}{operand}")
        value = new
    return {
        "prompt": " ".join([str(start), *operations]) + "\n",
        "solution": str(value),
        "start": start,
        "operations": operations,
    }


def is_held_out(prompt: str) -> bool:
    """Whether a question belongs to the held-out part of the question space: a fixed ~10%, chosen by a hash
    of the question text, the same for every seed and split size (as the arithmetic task does)."""
    digest = hashlib.blake2b(prompt.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 1000 < HELD_OUT_FRACTION * 1000


def make_chain_splits(
    seed: int = 0,
    num_train: int = 5000,
    num_test: int = 200,
    *,
    num_ops: int = 3,
    max_start: int = 20,
    max_operand: int = 20,
    max_factor: int = 5,
    max_value: int = 999,
    ops: str = "+-*",
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Generate ``(train, test)`` rows from ``seed``; the same arguments always give the same rows.

    Each row: ``prompt`` (``"17 +8 *2 -5\\n"``), ``solution`` (the exact result as a string, ``"45"``),
    ``start`` (17) and ``operations`` (``["+8", "*2", "-5"]``), the columns the verifiers read. Questions
    are distinct within a split. The two splits are disjoint whatever the seeds and sizes: a fixed ~10% of
    all questions (by a hash of the prompt, see ``is_held_out``) may only appear in the test split, the rest
    only in the train split; so a policy cold-started on any train split never sees a held-out question.
    Each split has its own random stream, so a smaller ``num_train`` (``num_test``) gives a prefix of a
    larger one. ``+n``/``-n`` use 1 <= n <= max_operand (a subtraction never goes below 0), ``*n``
    2 <= n <= max_factor.
    """
    if num_ops < 1:
        raise ValueError(f"num_ops must be >= 1, got {num_ops}")
    if not ops or set(ops) - set("+-*") or ops == "-":
        raise ValueError(f"ops must be a non-empty subset of '+-*' other than '-' alone, got {ops!r}")
    if max_start < 1 or max_operand < 1 or max_factor < 2 or max_value < max_start:
        raise ValueError("need max_start >= 1, max_operand >= 1, max_factor >= 2 and max_value >= max_start")

    def draw(stream: str, n: int, held_out: bool) -> list[dict[str, Any]]:
        rng = random.Random(f"grpokit-chain-{seed}-{stream}")
        seen: set[str] = set()
        rows: list[dict[str, Any]] = []
        budget = 50 * n / (HELD_OUT_FRACTION if held_out else 1 - HELD_OUT_FRACTION) + 1000
        while len(rows) < n:
            budget -= 1
            if budget < 0:
                raise ValueError(
                    f"could not draw {n} distinct {stream} questions with num_ops={num_ops}; "
                    "lower num_train/num_test or widen the ranges"
                )
            row = _draw_question(rng, num_ops, max_start, max_operand, max_factor, max_value, ops)
            if row["prompt"] not in seen and is_held_out(row["prompt"]) == held_out:
                seen.add(row["prompt"])
                rows.append(row)
        return rows

    return draw("train", num_train, held_out=False), draw("test", num_test, held_out=True)


def worked_solution(row: dict[str, Any]) -> str:
    """``"17+8=25\\n25*2=50\\n50-5=45\\n<answer>45</answer>"``; no trailing newline (EOS is a token)."""
    values = chain_values(row["start"], row["operations"])
    lines = [f"{values[k]}{op}={values[k + 1]}" for k, op in enumerate(row["operations"])]
    return "\n".join([*lines, f"{ANSWER_OPEN}{values[-1]}{ANSWER_CLOSE}"])


extract_chain_answer = integer_answer
"""The integer in the last ``<answer>...</answer>``, normalised (``"045"`` -> ``"45"``), or None."""

chain_outcome_reward = make_integer_answer_reward("chain_outcome_reward")
"""Outcome reward (TRL signature): 1.0 when the answer equals the row's ``solution``, else 0.0; the library's
:func:`grpokit.rewards.make_accuracy_reward` (math-verify) reading the integer in the ``<answer>`` tag."""


def _check_line(
    line: str, k: int, operations: Sequence[str], expected_in: int | None
) -> tuple[bool, int | None]:
    """Is ``line`` right as step k given the value it should start from? Returns (right, written result)."""
    line = _SPECIAL_RE.sub("", line)
    n = len(operations)
    if k < n:
        m = _LINE_RE.fullmatch(line)
        if m is None:
            return False, None
        a, op, b, c = int(m.group(1)), m.group(2), m.group(3), int(m.group(4))
        operation = f"{op}{int(b)}"
        right = operation == operations[k] and a == expected_in and c == apply_op(a, operation)
        return right, c
    if k == n:
        m = _ANSWER_LINE_RE.fullmatch(line)
        return (m is not None and int(m.group(1)) == expected_in), None
    return False, None


def make_chain_step_verifier(mode: str = "prefix"):
    """A process reward function for the chain task; ``mode`` is ``"prefix"`` or ``"local"`` (see module doc).

    Signature: ``fn(prompts, completions, steps, *, start, operations, **columns) -> list[list[float]]``,
    one 1.0/0.0 per step string in ``steps[i]``.
    """
    if mode not in ("prefix", "local"):
        raise ValueError(f"mode must be 'prefix' or 'local', got {mode!r}")

    def verifier(
        prompts: Sequence[Any], completions: Sequence[Any], steps: Sequence[Sequence[str]], **columns: Any
    ) -> list[list[float]]:
        out = []
        for i, row_steps in enumerate(steps):
            start, operations = int(columns["start"][i]), list(columns["operations"][i])
            values = chain_values(start, operations)
            rewards, on_track, written = [], True, start
            for k, line in enumerate(row_steps):
                if mode == "prefix":
                    expected = values[k] if k < len(values) else None
                    right, _ = _check_line(line, k, operations, expected)
                    right = right and on_track
                    on_track = right
                else:
                    right, result = _check_line(line, k, operations, written)
                    written = result if result is not None else written
                rewards.append(1.0 if right else 0.0)
            out.append(rewards)
        return out

    verifier.__name__ = "chain_steps" if mode == "prefix" else "chain_steps_local"
    return verifier


chain_step_reward = make_chain_step_verifier("prefix")
chain_step_reward_local = make_chain_step_verifier("local")


def corrupt_solution(row: dict[str, Any], rng: random.Random) -> str:
    """A plausible wrong solution: one step's result is off by 1..10 (never negative) and later steps carry
    the wrong value on correctly; or, one time in five, the answer alone is wrong; or, one time in ten,
    the solution stops early (no answer line)."""
    values = chain_values(row["start"], row["operations"])
    operations = row["operations"]
    kind = rng.random()
    if kind < 0.1:
        cut = rng.randint(1, len(operations))
        return "\n".join(worked_solution(row).split("\n")[:cut])
    if kind < 0.3:
        wrong = values[-1] + rng.choice([d for d in range(-10, 11) if d != 0 and values[-1] + d >= 0])
        lines = worked_solution(row).split("\n")[:-1]
        return "\n".join([*lines, f"{ANSWER_OPEN}{wrong}{ANSWER_CLOSE}"])
    k = rng.randrange(len(operations))
    lines, value = [], values[0]
    for j, operation in enumerate(operations):
        result = apply_op(value, operation)
        if j == k:
            result += rng.choice([d for d in range(-10, 11) if d != 0 and result + d >= 0])
        lines.append(f"{value}{operation}={result}")
        value = result
    return "\n".join([*lines, f"{ANSWER_OPEN}{value}{ANSWER_CLOSE}"])


def make_chain_rm_samples(
    rows: Sequence[dict[str, Any]], *, kind: str = "process", seed: int = 0, correct_fraction: float = 0.5
) -> list[dict[str, Any]]:
    """Labelled reward-model samples, one per row: the worked solution (probability ``correct_fraction``)
    or a ``corrupt_solution``. ``kind="outcome"``: ``{"prompt", "completion", "label"}`` (the outcome
    reward); ``kind="process"``: ``{"prompt", "completion", "step_labels"}`` (``chain_step_reward``)."""
    if kind not in ("outcome", "process"):
        raise ValueError(f"kind must be 'outcome' or 'process', got {kind!r}")
    rng = random.Random(f"grpokit-chain-rm-{seed}")
    completions = []
    for row in rows:  # one draw per row, then (when corrupted) the corruption's own draws
        correct = rng.random() < correct_fraction
        completions.append(worked_solution(row) if correct else corrupt_solution(row, rng))
    return label_chain_samples(rows, completions, kind=kind)


def label_chain_samples(
    rows: Sequence[dict[str, Any]], completions: Sequence[str], *, kind: str = "process"
) -> list[dict[str, Any]]:
    """Reward-model samples labelled by rule, one per completion (``completions[i]`` answers ``rows[i]``):
    ``kind="outcome"``: ``{"prompt", "completion", "label"}`` (``chain_outcome_reward``);
    ``kind="process"``: ``{"prompt", "completion", "step_labels", "reference"}`` (``chain_step_reward``;
    ``reference`` the worked solution, for dense per-token labels)."""
    if kind not in ("outcome", "process"):
        raise ValueError(f"kind must be 'outcome' or 'process', got {kind!r}")
    if len(rows) != len(completions):
        raise ValueError(f"{len(rows)} rows but {len(completions)} completions")
    from grpokit.rewards.process_rewards.steps import step_texts

    prompts = [row["prompt"] for row in rows]
    samples = [{"prompt": p, "completion": c} for p, c in zip(prompts, completions)]
    if kind == "outcome":
        labels = chain_outcome_reward(prompts, list(completions), solution=[row["solution"] for row in rows])
        for sample, label in zip(samples, labels):
            sample["label"] = label
        return samples
    step_labels = chain_step_reward(
        prompts, list(completions), [step_texts(c) for c in completions],
        start=[row["start"] for row in rows], operations=[row["operations"] for row in rows],
    )  # fmt: skip
    for sample, labels, row in zip(samples, step_labels, rows):
        sample["step_labels"] = labels
        sample["reference"] = worked_solution(row)
    return samples


def make_chain_policy_rm_samples(
    model: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    *,
    kind: str = "process",
    num_generations: int = 8,
    temperature: float = 1.0,
    max_new_tokens: int = 48,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Reward-model samples from a policy's own completions: ``num_generations`` sampled completions of
    each row's question (at ``temperature``, reproducible from ``seed``), labelled by rule
    (:func:`label_chain_samples`). The samples of one question are consecutive. This is the data a reward
    model meets during RL: the policy's mistakes, not made-up ones."""
    from grpokit.eval import generate_completions

    if num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations}")
    out = generate_completions(
        model, tokenizer, list(rows), num_samples=num_generations, temperature=temperature,
        max_new_tokens=max_new_tokens, seed=seed,
    )  # fmt: skip
    repeated = [row for row in rows for _ in range(num_generations)]
    return label_chain_samples(repeated, [t for texts in out.texts for t in texts], kind=kind)
