"""Held-out evaluation of a causal LM on rows with a ``prompt`` and a ``solution``, graded by a reward
function or an answer extractor. Knows no task: the caller says how to grade.

Greedy decoding (``temperature=0``, one sample) gives ``accuracy``; sampling ``num_samples`` completions
per prompt at ``temperature > 0`` adds ``pass@k`` and ``mean@k`` with ``k = num_samples``, and ``maj@k``
when an answer extractor is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from tqdm.auto import tqdm

from grpokit.core import pad_left, trim_at_eos
from grpokit.data.chat import as_completion, render_prompt
from grpokit.data.loading import reward_columns
from grpokit.eval.metrics import maj_at_k, mean_at_k, mean_pass_at_k
from grpokit.models.loading import pad_token_id
from grpokit.rewards.base import RewardFunc
from grpokit.rewards.scoring import score_completions

__all__ = ["evaluate_accuracy", "stop_token_ids"]


def _rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [dict(r) for r in rows]


@torch.no_grad()
def evaluate_accuracy(
    model: Any,
    tokenizer: Any,
    rows: Iterable[Mapping[str, Any]],
    *,
    reward_fn: RewardFunc | None = None,
    extract_fn: Callable[[str], Any] | None = None,
    correct_threshold: float = 1.0,
    batch_size: int = 256,
    max_new_tokens: int = 64,
    num_samples: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    device: str | torch.device | None = None,
    return_completions: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Generate for every row and score the completions.

    rows: dicts (or a ``datasets.Dataset``) with ``prompt`` (a string, or a list of chat messages rendered
    with the tokenizer's chat template) and ``solution``.

    Correctness of one completion: with ``reward_fn`` (TRL signature ``fn(prompts, completions,
    completion_ids, **columns)``, the rows' other columns forwarded), the reward is ``>= correct_threshold``;
    without it, ``extract_fn(completion) == str(solution)``. One of the two is required. Completions of
    conversational prompts are passed as ``[{"role": "assistant", "content": text}]``, as TRL does.

    Decoding: ``temperature == 0`` is greedy (then ``num_samples`` must be 1); otherwise multinomial
    sampling with ``temperature``, ``top_p`` and ``top_k`` (0 = off), reproducible from ``seed``. Prompts are
    left-padded; generation stops at the tokenizer's EOS. ``batch_size`` counts sequences
    (prompts x samples) per ``generate`` call. Runs on ``device`` or else the model's device; the model's
    train/eval mode is restored afterwards.

    Returns ``accuracy`` (the fraction of correct completions over all samples: greedy accuracy when
    greedy, the single-sample accuracy mean@k when sampling), ``num_examples``, ``num_samples``,
    ``temperature``, ``mean_completion_tokens``, ``truncated_rate`` (no EOS within ``max_new_tokens``),
    with ``extract_fn`` also ``format_rate`` (fraction with an extractable answer), and with
    ``num_samples = k > 1`` ``pass@k`` (unbiased estimator), ``mean@k`` and, with ``extract_fn``, ``maj@k``
    (majority over the extracted answers). ``return_completions=True`` adds
    ``completions``: per row ``{"prompt", "solution", "completions", "correct"}``.
    """
    rows = _rows(rows)
    if not rows:
        raise ValueError("no rows to evaluate")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    greedy = temperature == 0.0
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if greedy and num_samples > 1:
        raise ValueError(
            "greedy decoding (temperature=0) gives identical samples; use temperature > 0 for num_samples > 1"
        )
    if reward_fn is None and extract_fn is None:
        raise ValueError("evaluate_accuracy needs a reward_fn or an extract_fn to tell right from wrong")
    if device is None:
        device = next(model.parameters()).device
    pad_id = pad_token_id(tokenizer)
    eos_ids = stop_token_ids(model, tokenizer)

    was_training = model.training
    model.eval()
    prompts_per_call = max(1, batch_size // num_samples)
    completions: list[list[str]] = []
    completion_ids: list[list[list[int]]] = []
    truncated = 0
    devices = [device] if torch.device(device).type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            chunks = range(0, len(rows), prompts_per_call)
            for start in tqdm(chunks, desc="eval", disable=not progress, leave=False):
                chunk = rows[start : start + prompts_per_call]
                texts = [render_prompt(r["prompt"], tokenizer) for r in chunk]
                prompt_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
                input_ids, attention_mask = pad_left(prompt_ids, pad_id, device)  # [B, P] each
                sampling = (
                    {"do_sample": False}
                    if greedy
                    else {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": top_k}
                )
                out = model.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    max_new_tokens=max_new_tokens,
                    num_return_sequences=num_samples,
                    eos_token_id=eos_ids,
                    pad_token_id=pad_id,
                    **sampling,
                )
                new = out[:, input_ids.shape[1] :].tolist()  # [B*num_samples, <=max_new_tokens]
                for i in range(len(chunk)):
                    ids_i = []
                    for seq in new[i * num_samples : (i + 1) * num_samples]:
                        ids, cut_short = trim_at_eos(seq, eos_ids)
                        truncated += int(cut_short)
                        ids_i.append(ids)
                    completion_ids.append(ids_i)
                    completions.append(tokenizer.batch_decode(ids_i, skip_special_tokens=True))
    finally:
        model.train(was_training)

    golds = [str(r["solution"]).strip() for r in rows]
    answers = [[extract_fn(c) for c in cs] for cs in completions] if extract_fn is not None else None
    if reward_fn is not None:
        correct = _correct_by_reward(reward_fn, rows, completions, completion_ids, correct_threshold)
    else:
        correct = [[a is not None and str(a) == g for a in ans] for ans, g in zip(answers, golds)]

    n_total = len(rows) * num_samples
    result: dict[str, Any] = {
        "accuracy": sum(sum(c) for c in correct) / n_total,
        "num_examples": len(rows),
        "num_samples": num_samples,
        "temperature": temperature,
        "mean_completion_tokens": sum(len(x) for ids in completion_ids for x in ids) / n_total,
        "truncated_rate": truncated / n_total,
    }
    if answers is not None:
        result["format_rate"] = sum(a is not None for ans in answers for a in ans) / n_total
    if num_samples > 1:
        k = num_samples
        result[f"pass@{k}"] = mean_pass_at_k(correct, k)
        if answers is not None:
            votes = [[None if a is None else str(a) for a in ans] for ans in answers]
            result[f"maj@{k}"] = maj_at_k(votes, golds)
        result[f"mean@{k}"] = mean_at_k(correct)
    if return_completions:
        result["completions"] = [
            {"prompt": r["prompt"], "solution": r["solution"], "completions": cs, "correct": c}
            for r, cs, c in zip(rows, completions, correct)
        ]
    return result


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids that end a completion: the tokenizer's EOS and every EOS id of the model's generation config
    (instruct models often name several, e.g. Qwen's ``<|im_end|>`` and ``<|endoftext|>``)."""
    ids: list[int] = []
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for e in (tokenizer.eos_token_id, gen_eos):
        for i in e if isinstance(e, (list, tuple)) else [e]:
            if i is not None and i not in ids:
                ids.append(int(i))
    if not ids:
        raise ValueError("the tokenizer has no eos_token_id and the model's generation config names none")
    return ids


def _correct_by_reward(
    reward_fn: RewardFunc,
    rows: list[dict[str, Any]],
    completions: list[list[str]],
    completion_ids: list[list[list[int]]],
    threshold: float,
) -> list[list[bool]]:
    """Whether each completion's reward reaches ``threshold`` (None never does); checked like training
    rewards (:func:`grpokit.rewards.score_completions`, a failure raises)."""
    k = len(completions[0])
    repeated = [r for r in rows for _ in range(k)]
    rewards, _ = score_completions(
        [reward_fn],
        prompts=[r["prompt"] for r in repeated],
        completions=[as_completion(c, r["prompt"]) for r, cs in zip(rows, completions) for c in cs],
        completion_ids=[ids for per_row in completion_ids for ids in per_row],
        columns=reward_columns(repeated),
    )
    ok = (rewards[:, 0] >= threshold).tolist()  # NaN (None) compares False
    return [ok[i * k : (i + 1) * k] for i in range(len(rows))]
