"""Generation backends behind one protocol (:class:`RolloutBackend`), and the records of one step.

``transformers``' ``generate`` (``hf``), grpokit's fast sampler (``fast``, with ``native_decode`` for
Llama-family models and ``logits`` for the sampling distribution), vLLM (``vllm_backend``,
``vllm_client``), a scripted in-memory backend for tests (``fake``); ``records``: Samples, Scores and
RolloutBatch, the records a step passes along."""

from grpokit.rollout.backends import GENERATION_BACKENDS, make_backend, resolve_backend_name
from grpokit.rollout.base import GenerationOutput, RolloutBackend, SamplingParams, generate_groups
from grpokit.rollout.fake import ScriptedBackend
from grpokit.rollout.fast import FastSampler
from grpokit.rollout.hf import TransformersBackend
from grpokit.rollout.logits import process_logits, sample_token

__all__ = [
    "GENERATION_BACKENDS",
    "FastSampler",
    "GenerationOutput",
    "RolloutBackend",
    "SamplingParams",
    "ScriptedBackend",
    "TransformersBackend",
    "generate_groups",
    "make_backend",
    "process_logits",
    "resolve_backend_name",
    "sample_token",
]
