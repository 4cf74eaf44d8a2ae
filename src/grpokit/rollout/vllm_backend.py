"""vLLM as a ``RolloutBackend``: colocated in the trainer's process (this module) or as a server
(``grpokit.rollout.vllm_client``). Untested on GPU: written against vLLM 0.22-0.31's and TRL 1.16's code
(docs/generation.md, "The vLLM backend").

Colocate mode, as TRL's ``vllm_mode="colocate"``: each training process builds a ``vllm.LLM`` on its own GPU
with ``distributed_executor_backend="external_launcher"``, which runs vLLM's engine core in this process
(vLLM sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` for it), so the engine's model is a Python object here:
``llm.llm_engine.model_executor.driver_worker.model_runner`` and its ``load_weights``. The engine is built
from the policy's config with ``load_format="dummy"`` (random weights, nothing read from disk) and receives
the policy's weights (``weight_names.policy_weights``: plain names, LoRA merged, FSDP gathered) before its
first generation and, by default, at the start of every ``generate`` call; the prefix cache is reset after
each push. ``enable_prefix_caching=True``: the G samples of a prompt (``n=G``) share its prefill.

The sampling log-probs are vLLM's ``logprobs_mode="processed_logprobs"``: log-probs of the distribution the
token was drawn from, after the repetition penalty, temperature, min_p, top_k and top_p (TRL's setting, and
what grpokit's in-process samplers report). vLLM applies min_p before top_k/top_p, ``transformers`` after:
the two distributions differ only when min_p is combined with top_k or top_p.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
import socket
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from grpokit.rollout.base import GenerationOutput, SamplingParams
from grpokit.rollout.weight_names import autocast_off, policy_weights

__all__ = [
    "VLLMColocateBackend",
    "VLLMSettings",
    "VLLMUnavailableError",
    "chosen_logprobs",
    "colocate_engine_kwargs",
    "is_truncated",
    "make_vllm_backend",
    "process_layout",
    "require_vllm",
    "vllm_sampling_kwargs",
]

logger = logging.getLogger(__name__)


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
    """colocate: the fraction of the GPU's memory the engine takes."""
    max_model_length: int | None = None
    """colocate: the engine's context length (None: the model config's)."""
    enable_sleep_mode: bool = False
    """colocate: offload the engine's weights and free its KV cache between generations."""
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


class VLLMUnavailableError(RuntimeError):
    """``use_vllm=True`` on a machine without the ``vllm`` package or without a CUDA GPU."""


def require_vllm(mode: str) -> None:
    """Raise ``VLLMUnavailableError`` naming what is missing and the alternative, unless ``vllm`` is
    installed and a CUDA GPU is visible. Both modes need them: colocate runs the engine here, and server mode
    pushes the weights over NCCL (vLLM's communicator, CUDA only)."""
    missing = []
    if importlib.util.find_spec("vllm") is None:
        missing.append("the vllm package (pip install 'grpokit[vllm]')")
    if not torch.cuda.is_available():
        missing.append("a CUDA GPU")
    if missing:
        raise VLLMUnavailableError(
            f"GRPOConfig.use_vllm=True (vllm_mode={mode!r}) needs {' and '.join(missing)}, which this "
            f"machine does not have. {ALTERNATIVE}."
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


def chosen_logprobs(token_ids: Sequence[int], positions: Sequence[Any] | None) -> list[float] | None:
    """The log-prob of each sampled token from vLLM's per-position logprobs (``{token_id: Logprob}`` dicts);
    None when the engine returned none. A missing or NaN value stays NaN (unknown: the correction uses ratio 1
    there)."""
    if positions is None:
        return None
    values = []
    for token, position in zip(token_ids, positions):
        entry = position.get(token) if position is not None else None
        value = getattr(entry, "logprob", entry)
        values.append(float("nan") if value is None else float(value))
    return values


def outputs_to_generation(outputs: Sequence[Any], eos_ids: Sequence[int]) -> GenerationOutput:
    """vLLM ``RequestOutput``s (one per prompt, each with its n ``CompletionOutput``s) as a
    ``GenerationOutput``, grouped per prompt in prompt order."""
    ids: list[list[int]] = []
    logps: list[list[float] | None] = []
    truncated: list[bool] = []
    for request in outputs:
        for completion in sorted(request.outputs, key=lambda c: c.index):
            tokens = list(completion.token_ids)
            ids.append(tokens)
            logps.append(chosen_logprobs(tokens, completion.logprobs))
            truncated.append(is_truncated(tokens, completion.finish_reason, eos_ids))
    reported = None if any(row is None for row in logps) else [row for row in logps if row is not None]
    return GenerationOutput(ids, reported, truncated)


def process_layout() -> tuple[int, int, int]:
    """``(rank, local_rank, world_size)`` of this training process: torch.distributed's when initialised
    (accelerate does it for several processes), else the launcher's environment, else a single process."""
    local = int(os.environ.get("LOCAL_RANK", 0))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), local, torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), local, int(os.environ.get("WORLD_SIZE", 1))


def hf_model(model: nn.Module) -> nn.Module:
    """The ``transformers`` model under a PEFT wrapper (itself otherwise)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def engine_config_dir(model: nn.Module) -> str:
    """A fresh directory with the policy's ``config.json`` (``architectures`` filled in), which the engine is
    built from: the config of the model being trained (its vocabulary after any resize), whatever its
    origin (a hub id, a directory, an object built in memory)."""
    inner = hf_model(model)
    config = copy.deepcopy(inner.config)
    if not getattr(config, "architectures", None):
        config.architectures = [type(inner).__name__]
    path = tempfile.mkdtemp(prefix="grpokit-vllm-")
    config.save_pretrained(path)
    return path


def colocate_engine_kwargs(settings: VLLMSettings, config_dir: str, *, rank: int) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments for one training process's colocated engine (TRL 1.16's colocate
    settings, with ``load_format="dummy"``: the weights come from the policy, pushed before generating).

    ``generation_config="vllm"``: the checkpoint's generation_config.json adds no defaults and no EOS ids
    (grpokit's ``SamplingParams`` say everything); ``skip_tokenizer_init``: prompts and completions are token
    ids. ``seed``: the run's seed plus the process rank (each process draws its own samples)."""
    return {
        "model": config_dir,
        "load_format": "dummy",
        "dtype": settings.dtype,
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "max_model_len": settings.max_model_length,
        "enable_sleep_mode": settings.enable_sleep_mode,
        "enable_prefix_caching": True,
        "model_impl": settings.model_impl,
        "distributed_executor_backend": "external_launcher",
        "seed": settings.seed + rank,
        "max_num_batched_tokens": 4096,
        "logprobs_mode": "processed_logprobs",
        "generation_config": "vllm",
        "skip_tokenizer_init": True,
        "trust_remote_code": settings.trust_remote_code,
    }


def set_launcher_env(rank: int, local_rank: int, world_size: int) -> None:
    """The torch.distributed environment vLLM's external launcher reads (as TRL sets it); MASTER_ADDR/PORT
    only when the launcher did not (a single process: this machine, a free port)."""
    os.environ["RANK"], os.environ["LOCAL_RANK"] = str(rank), str(local_rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(probe.getsockname()[1])


class VLLMColocateBackend:
    """A ``RolloutBackend`` generating with an in-process ``vllm.LLM`` from the live policy ``model``.

    ``sync_every_generate`` (default True): push the policy's weights at the start of every ``generate``
    call, simple and always correct (a push is a device-to-device copy of the weights). False: push before
    the first generation, then only when the trainer calls ``sync_weights()`` (after each update, within its
    full-weights context) or ``mark_weights_changed()`` (the next ``generate`` pushes)."""

    def __init__(self, model: nn.Module, engine_kwargs: dict[str, Any], *, sync_every_generate: bool = True):
        import vllm

        self.model, self.sync_every_generate = model, sync_every_generate
        self.sleep_mode = bool(engine_kwargs.get("enable_sleep_mode"))
        self._vllm = vllm
        self.llm = vllm.LLM(**engine_kwargs)
        self._stale, self._sleeping = True, False
        if self.sleep_mode:
            self._sleep()

    def mark_weights_changed(self) -> None:
        """The policy's weights changed (an optimizer step): push them before the next generation."""
        self._stale = True

    def engine_model(self) -> nn.Module:
        """The engine's model (with ``load_weights``), reachable because the engine core runs here."""
        try:
            runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
        except AttributeError as err:
            raise RuntimeError(
                "the colocated vLLM engine does not run in this process (no llm_engine.model_executor), so "
                "its weights cannot be updated; it is built with distributed_executor_backend="
                "'external_launcher', which needs VLLM_ENABLE_V1_MULTIPROCESSING=0 (vLLM sets it)"
            ) from err
        return runner.get_model() if hasattr(runner, "get_model") else runner.model

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Push the policy's current weights into the engine and drop its prefix cache (KV of old weights)."""
        self._wake()
        target = self.engine_model()
        with autocast_off():
            for name, tensor in policy_weights(self.model):
                target.load_weights([(name, tensor)])
        self.llm.reset_prefix_cache()
        self._stale = False

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], num_generations: int, params: SamplingParams
    ) -> GenerationOutput:
        """``num_generations`` completions per prompt (grouped contiguously), with sampling log-probs."""
        self._wake()
        if self.sync_every_generate or self._stale:
            self.sync_weights()
        kwargs = vllm_sampling_kwargs(params, num_generations)
        sampling = self._vllm.SamplingParams(**kwargs, detokenize=False)
        prompts = [{"prompt_token_ids": list(ids)} for ids in prompt_ids]
        with autocast_off():  # the engine runs in its own dtype, not under the trainer's autocast
            outputs = self.llm.generate(prompts, sampling_params=sampling, use_tqdm=False)
        if self.sleep_mode:
            self._sleep()
        return outputs_to_generation(outputs, params.eos_token_ids)

    def _sleep(self) -> None:
        """Sleep level 1: weights offloaded to CPU memory (restored on wake-up), KV cache freed. Level 2 would
        discard the weights and the engine's buffers (rotary caches), which a weight push does not restore."""
        self.llm.sleep(level=1)
        self._sleeping = True

    def _wake(self) -> None:
        if self._sleeping:
            torch.cuda.empty_cache()
            self.llm.wake_up()
            self._sleeping = False


def make_vllm_backend(settings: VLLMSettings, model: nn.Module, *, step_sync: bool = False) -> Any:
    """The vLLM backend ``settings`` (``GRPOConfig.vllm_settings()``) ask for, over the policy ``model``.

    Raises ``VLLMUnavailableError`` without vLLM or CUDA (naming ``use_vllm=False``), ValueError for server
    mode under several training processes unless ``step_sync`` (the trainer pushes the weights at step
    boundaries, where every process is in step), ConnectionError when the server does not answer within
    ``vllm_server_timeout``. ``step_sync``: the trainer calls the backend's ``sync_weights()`` after each
    update, on every process and within its full-weights context, so ``generate`` pushes only before the
    first generation instead of at every call."""
    require_vllm(settings.mode)
    if settings.mode == "server":
        from grpokit.rollout.vllm_client import make_server_backend

        return make_server_backend(settings, model, step_sync=step_sync)
    rank, local_rank, world_size = process_layout()
    set_launcher_env(rank, local_rank, world_size)
    engine_kwargs = colocate_engine_kwargs(settings, engine_config_dir(model), rank=rank)
    logger.info("vLLM colocate engine on process %d: %s", rank, engine_kwargs)
    return VLLMColocateBackend(model, engine_kwargs, sync_every_generate=not step_sync)
