"""Sampling metrics over n completions per prompt: pass@k, maj@k, mean@k.

pass@k uses the unbiased estimator of Chen et al. 2021 (arXiv:2107.03374, "Evaluating Large Language Models
Trained on Code"): with n samples of which c are correct,

    pass@k = 1 - C(n - c, k) / C(n, k)

the probability that at least one of k samples drawn without replacement from the n is correct.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

__all__ = ["maj_at_k", "majority_vote", "mean_at_k", "mean_pass_at_k", "pass_at_k"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one prompt: n samples, c of them correct, budget k (1 <= k <= n).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k / i), which equals 1 - C(n-c, k) / C(n, k) without the
    large binomials.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def mean_pass_at_k(correct_per_prompt: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k averaged over prompts; ``correct_per_prompt[p]`` holds one bool per sample of prompt p."""
    if not correct_per_prompt:
        raise ValueError("no prompts")
    return sum(pass_at_k(len(c), sum(map(bool, c)), k) for c in correct_per_prompt) / len(correct_per_prompt)


def mean_at_k(correct_per_prompt: Sequence[Sequence[bool]]) -> float:
    """mean@k: the fraction of correct samples per prompt (k = samples per prompt), averaged over prompts.

    It estimates the accuracy of a single sample at the sampling temperature.
    """
    if not correct_per_prompt:
        raise ValueError("no prompts")
    if any(len(c) == 0 for c in correct_per_prompt):
        raise ValueError("every prompt needs at least one sample")
    return sum(sum(map(bool, c)) / len(c) for c in correct_per_prompt) / len(correct_per_prompt)


def majority_vote(answers: Sequence[Hashable | None]) -> Hashable | None:
    """The most frequent answer, ignoring None (no answer). Ties go to the answer seen first; all-None
    gives None."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == best)


def maj_at_k(answers_per_prompt: Sequence[Sequence[Hashable | None]], gold: Sequence[Hashable]) -> float:
    """maj@k (self-consistency): the fraction of prompts whose majority answer equals the gold answer.

    ``answers_per_prompt[p]`` holds the k extracted answers of prompt p (None where nothing was extracted,
    which casts no vote); a prompt with no answers at all counts as wrong.
    """
    if len(answers_per_prompt) != len(gold):
        raise ValueError(f"{len(answers_per_prompt)} prompts but {len(gold)} gold answers")
    if not gold:
        raise ValueError("no prompts")
    hits = 0
    for answers, g in zip(answers_per_prompt, gold):
        vote = majority_vote(answers)
        hits += int(vote is not None and vote == g)
    return hits / len(gold)
