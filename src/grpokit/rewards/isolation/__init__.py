"""Untrusted work in other processes: math-verify in worker processes with a hard time limit
(:class:`MathVerifier`), and Python code in a confined sandbox (:func:`run_python_tests`)."""

from grpokit.rewards.isolation.sandbox import (
    SandboxError,
    SandboxLimits,
    SandboxResult,
    namespaces_available,
    run_python_tests,
)
from grpokit.rewards.isolation.verifier import MathVerifier, integer_verdict, shared_verifier

__all__ = [
    "MathVerifier",
    "SandboxError",
    "SandboxLimits",
    "SandboxResult",
    "integer_verdict",
    "namespaces_available",
    "run_python_tests",
    "shared_verifier",
]
