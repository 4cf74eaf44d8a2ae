"""The fields of ``GRPOConfig`` about where the samples come from (docs/generation.md): the dtype the sampler
generates in, and the off-policy correction for a sampler that is not the trainer's pi_old (TRL's
``vllm_importance_sampling_*`` fields, with TRL's names, defaults and meanings). ``GRPOConfig`` inherits
them and ``validate_generation_fields`` checks them."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal, get_args

__all__ = ["GENERATION_DTYPES", "IS_MODES", "GenerationFields", "validate_generation_fields"]

logger = logging.getLogger("grpokit")

ImportanceSamplingMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
GenerationDtype = Literal["auto", "float32", "bfloat16", "float16"]
IS_MODES: tuple[str, ...] = get_args(ImportanceSamplingMode)
GENERATION_DTYPES: tuple[str, ...] = get_args(GenerationDtype)


@dataclass
class GenerationFields:
    """The sampler's dtype and the off-policy correction (see ``GRPOConfig``)."""

    generation_dtype: GenerationDtype = "auto"
    """Dtype of the weights the sampler generates from. auto: the policy itself (no copy). Another dtype
    than the policy's: a copy of the policy in that dtype, refreshed from the policy before each generation
    (one more copy of the weights in memory), so that e.g. a bfloat16 sampler feeds an fp32 training run,
    as vLLM does. The samples are then off-policy with respect to pi_old, and the correction below
    applies."""
    vllm_importance_sampling_correction: bool = True
    """Correct for the mismatch between the sampler's log-probs and the trainer's pi_old (TRL's name and
    default) with importance-sampling weights pi_old / pi_sampler on the policy term. Applies only where the
    sampler is not pi_old: ``generation_dtype`` differs from the policy's, or a ``rollout_backend`` given to
    the trainer reports log-probs. Then old log-probs are computed even when num_iterations is 1."""
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


def validate_generation_fields(config: Any) -> None:
    """Each field's range, as ValueErrors naming the field; resolves the deprecated cap into clip_max."""
    from grpokit.config_checks import require

    require(
        config.generation_dtype in GENERATION_DTYPES,
        "generation_dtype",
        f"must be one of {GENERATION_DTYPES}, got {config.generation_dtype!r}",
    )
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
