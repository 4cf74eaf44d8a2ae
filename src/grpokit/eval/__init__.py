"""Evaluation for any model, data and grader: held-out accuracy by generation, pass@k, maj@k, mean@k.

``generic`` (``evaluate_model``, ``generate_completions``: any model and rows, through a rollout backend;
what ``grpokit eval`` runs), ``grading`` (``grade_completions``: reward functions and/or an answer
extractor, correctness, the summary metrics), ``evaluate`` (``evaluate_accuracy``: the trainer CLI's
before/after check with one grader), ``metrics`` (pass@k, maj@k, mean@k)."""

from grpokit.eval.evaluate import evaluate_accuracy, stop_token_ids
from grpokit.eval.generic import evaluate_model, generate_completions
from grpokit.eval.grading import (
    EvalCompletions,
    gold_answer,
    grade_completions,
    make_answer_match_reward,
    resolve_extractor,
    reward_weights_for,
    validate_grading,
)
from grpokit.eval.metrics import maj_at_k, majority_vote, mean_at_k, mean_pass_at_k, pass_at_k

__all__ = [
    "EvalCompletions",
    "evaluate_accuracy",
    "evaluate_model",
    "generate_completions",
    "gold_answer",
    "grade_completions",
    "maj_at_k",
    "majority_vote",
    "make_answer_match_reward",
    "mean_at_k",
    "mean_pass_at_k",
    "pass_at_k",
    "resolve_extractor",
    "reward_weights_for",
    "stop_token_ids",
    "validate_grading",
]
