"""The fields of ``GRPOConfig`` about where the samples come from (docs/generation.md): the dtype the sampler
generates in, the vLLM engine (TRL's ``use_vllm`` and ``vllm_*`` fields), the off-policy correction for
a sampler that is not the trainer's pi_old (TRL's ``vllm_importance_sampling_*`` fields), and asynchronous
rollouts (``async_generation``, ``max_staleness``). Names, defaults and
meanings are TRL 1.16's. ``GRPOConfig`` inherits them and ``validate_generation_fields`` checks them."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal, get_args

__all__ = [
    "GENERATION_DTYPES",
    "IS_MODES",
    "VLLM_MODEL_IMPLS",
    "VLLM_MODES",
    "GenerationFields",
    "validate_generation_fields",
]

logger = logging.getLogger("grpokit")

ImportanceSamplingMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
GenerationDtype = Literal["auto", "float32", "bfloat16", "float16"]
VLLMMode = Literal["colocate", "server"]
VLLMModelImpl = Literal["vllm", "transformers", "auto"]
IS_MODES: tuple[str, ...] = get_args(ImportanceSamplingMode)
GENERATION_DTYPES: tuple[str, ...] = get_args(GenerationDtype)
VLLM_MODES: tuple[str, ...] = get_args(VLLMMode)
VLLM_MODEL_IMPLS: tuple[str, ...] = get_args(VLLMModelImpl)


@dataclass
class GenerationFields:
    """The sampler's dtype and the off-policy correction (see ``GRPOConfig``)."""

    generation_dtype: GenerationDtype = "auto"
    """Dtype of the weights the sampler generates from. auto: the policy itself (no copy). Another dtype
    than the policy's: a copy of the policy in that dtype, refreshed from the policy before each generation
    (one more copy of the weights in memory), so that e.g. a bfloat16 sampler feeds an fp32 training run,
    as vLLM does. The samples are then off-policy with respect to pi_old, and the correction below
    applies. With ``use_vllm`` in colocate mode: the dtype of the vLLM engine (auto: the checkpoint's)."""

    # ---- vLLM (docs/generation.md, "The vLLM backend"; untested on GPU) ------------------------------------
    use_vllm: bool = False
    """Generate with vLLM (``pip install 'grpokit[vllm]'``, a CUDA GPU) instead of ``generation_backend``. The
    engine's log-probs differ slightly from the trainer's, so its samples are off-policy and the
    ``vllm_importance_sampling_*`` correction applies. On a machine without vLLM or without CUDA the trainer
    refuses to start, naming the alternative (``use_vllm=False``: ``generation_backend``)."""
    vllm_mode: VLLMMode = "colocate"
    """colocate: an in-process ``vllm.LLM`` on the training GPU, sharing its memory
    (``vllm_gpu_memory_utilization``). server: a vLLM server on other GPUs, started with ``trl vllm-serve``
    (TRL 1.16) or ``VLLM_SERVER_DEV_MODE=1 vllm serve ... --weight-transfer-config '{"backend": "nccl"}'``;
    the trainer pushes its weights to it over NCCL."""
    vllm_model_impl: VLLMModelImpl = "vllm"
    """colocate: the engine's model implementation (vLLM's own, or ``transformers``' through vLLM). In server
    mode it is the server's ``--model-impl``."""
    vllm_enable_sleep_mode: bool = False
    """colocate: offload the engine's weights to CPU memory and free its KV cache between generations
    (vLLM sleep level 1), so that the update has the GPU memory; waking costs a host-device copy."""
    vllm_server_base_url: str | None = None
    """server: the server's URL (e.g. ``http://10.0.0.5:8000``); when set, ``vllm_server_host`` and
    ``vllm_server_port`` are ignored."""
    vllm_server_host: str = "0.0.0.0"
    """server: the server's host (TRL's default ``0.0.0.0`` reaches a server on this machine)."""
    vllm_server_port: int = 8000
    """server: the server's HTTP port."""
    vllm_server_timeout: float = 240.0
    """server: seconds to wait for the server's ``/health`` to answer at construction (a server still loading
    its model), after which the trainer stops with a ConnectionError naming the URL."""
    vllm_group_port: int = 51216
    """server: the TCP port of the NCCL weight-transfer group's rendezvous, opened on the trainer's main
    process, which the server's workers connect to."""
    vllm_gpu_memory_utilization: float = 0.3
    """colocate: the fraction of the GPU's memory the engine takes (weights and KV cache); the rest is the
    trainer's. In server mode it is the server's ``--gpu-memory-utilization``."""
    vllm_max_model_length: int | None = None
    """colocate: the engine's context length (prompt + completion); None: the model config's. Set it to the
    longest prompt plus ``max_completion_length`` to size the KV cache to what the run needs."""
    vllm_tensor_parallel_size: int = 1
    """colocate: GPUs per engine (tensor parallelism). Only 1 is supported in colocate mode; for a model that
    needs several GPUs, use server mode (``--tensor-parallel-size`` on the server)."""
    vllm_importance_sampling_correction: bool = True
    """Correct for the mismatch between the sampler's log-probs and the trainer's pi_old (TRL's name and
    default) with importance-sampling weights pi_old / pi_sampler on the policy term. Applies only where the
    sampler is not pi_old: ``use_vllm``, ``generation_dtype`` different from the policy's, or a
    ``rollout_backend`` given to the trainer that reports log-probs. Then old log-probs are computed even when
    num_iterations is 1."""
    vllm_importance_sampling_mode: ImportanceSamplingMode = "sequence_mask"
    """token_truncate / token_mask: one ratio per token; sequence_truncate / sequence_mask: one ratio per
    sequence, exp(sum_t (log pi_old - log pi_sampler)), on all its tokens. truncate clamps the ratio to
    [clip_min, clip_max]; mask zeroes it outside (TRL's default: sequence_mask)."""
    vllm_importance_sampling_clip_max: float | None = 3.0
    """Upper bound C_max of the ratio (None: none)."""
    vllm_importance_sampling_clip_min: float | None = None
    """Lower bound C_min of the ratio (None: none)."""
    vllm_importance_sampling_cap: float | None = None
    """Deprecated in TRL: when set, it sets ``vllm_importance_sampling_clip_max`` (with a logged note)."""

    # ---- asynchronous rollouts (docs/generation.md, "Asynchronous rollouts") -------------------------------
    async_generation: bool = False
    """Generate (and score) the next steps' samples in a background thread while this step's update runs,
    from frozen copies of the policy at most ``max_staleness`` updates old; those samples are off-policy and
    the ``vllm_importance_sampling_*`` correction weights them. One process, in-process samplers only."""
    max_staleness: int = 1
    """With ``async_generation``: how many policy updates old the samples a step trains on may be (the
    number of draws kept in flight, one copy of the weights each). 0 is the synchronous loop exactly."""


def validate_generation_fields(config: Any) -> None:
    """Each field's range, as ValueErrors naming the field; resolves the deprecated cap into clip_max."""
    from grpokit.config.validation import require

    require(
        config.generation_dtype in GENERATION_DTYPES,
        "generation_dtype",
        f"must be one of {GENERATION_DTYPES}, got {config.generation_dtype!r}",
    )
    validate_vllm_fields(config)
    validate_correction_fields(config)
    require(config.max_staleness >= 0, "max_staleness", "must be >= 0 (0: synchronous)")


def validate_vllm_fields(config: Any) -> None:
    """The ``vllm_*`` fields' ranges (checked whether or not ``use_vllm`` is set: a typo should not wait
    for the day vLLM is turned on). Whether vLLM and CUDA are there is checked when the trainer is built
    (``grpokit.rollout.vllm_backend.require_vllm``): a config may be written on a machine without a GPU."""
    from grpokit.config.validation import require

    require(
        config.vllm_mode in VLLM_MODES, "vllm_mode", f"must be one of {VLLM_MODES}, got {config.vllm_mode!r}"
    )
    require(
        config.vllm_model_impl in VLLM_MODEL_IMPLS,
        "vllm_model_impl",
        f"must be one of {VLLM_MODEL_IMPLS}, got {config.vllm_model_impl!r}",
    )
    utilization = config.vllm_gpu_memory_utilization
    require(0 < utilization <= 1, "vllm_gpu_memory_utilization", f"must be in (0, 1], got {utilization}")
    require(config.vllm_tensor_parallel_size >= 1, "vllm_tensor_parallel_size", "must be >= 1")
    require(
        not (config.use_vllm and config.vllm_mode == "colocate" and config.vllm_tensor_parallel_size > 1),
        "vllm_tensor_parallel_size",
        f"must be 1 with use_vllm and vllm_mode='colocate' (one engine per training process, on its GPU), "
        f"got {config.vllm_tensor_parallel_size}; serve a model that needs several GPUs with "
        "vllm_mode='server' and the server's --tensor-parallel-size",
    )
    length = config.vllm_max_model_length
    require(length is None or length >= 1, "vllm_max_model_length", f"must be >= 1 or None, got {length}")
    for name in ("vllm_server_port", "vllm_group_port"):
        port = getattr(config, name)
        require(1 <= port <= 65535, name, f"must be a TCP port (1-65535), got {port}")
    require(config.vllm_server_timeout >= 0, "vllm_server_timeout", "must be >= 0 (seconds)")
    url = config.vllm_server_base_url
    require(
        url is None or url.startswith(("http://", "https://")),
        "vllm_server_base_url",
        f"must start with http:// or https://, got {url!r}",
    )


def validate_correction_fields(config: Any) -> None:
    """The ``vllm_importance_sampling_*`` fields; resolves the deprecated cap into clip_max."""
    from grpokit.config.validation import require

    require(
        config.vllm_importance_sampling_mode in IS_MODES,
        "vllm_importance_sampling_mode",
        f"must be one of {IS_MODES}, got {config.vllm_importance_sampling_mode!r}",
    )
    if config.vllm_importance_sampling_cap is not None:
        logger.warning(
            "GRPOConfig.vllm_importance_sampling_cap is deprecated (as in TRL): it sets "
            "vllm_importance_sampling_clip_max=%r; use vllm_importance_sampling_clip_max instead",
            config.vllm_importance_sampling_cap,
        )
        config.vllm_importance_sampling_clip_max = config.vllm_importance_sampling_cap
    low, high = config.vllm_importance_sampling_clip_min, config.vllm_importance_sampling_clip_max
    for name, bound in (
        ("vllm_importance_sampling_clip_min", low),
        ("vllm_importance_sampling_clip_max", high),
    ):
        require(
            bound is None or bound > 0,
            name,
            f"must be > 0 (a bound on a ratio of probabilities) or None, got {bound}",
        )
    if low is not None and high is not None:
        require(
            low < high,
            "vllm_importance_sampling_clip_min",
            f"({low}) must be < vllm_importance_sampling_clip_max ({high})",
        )
    truncate = config.vllm_importance_sampling_mode.endswith("_truncate")
    if config.vllm_importance_sampling_correction and truncate:
        require(
            low is not None or high is not None,
            "vllm_importance_sampling_clip_max",
            "and vllm_importance_sampling_clip_min cannot both be None with vllm_importance_sampling_mode="
            f"{config.vllm_importance_sampling_mode!r}: a truncation needs a bound",
        )
