"""Evaluation, for any model, data and grader: held-out accuracy by generation, pass@k, maj@k, mean@k."""

from grpokit.eval.evaluate import evaluate_accuracy
from grpokit.eval.metrics import maj_at_k, majority_vote, mean_at_k, mean_pass_at_k, pass_at_k

__all__ = [
    "evaluate_accuracy",
    "maj_at_k",
    "majority_vote",
    "mean_at_k",
    "mean_pass_at_k",
    "pass_at_k",
]
