"""The fields of ``GRPOConfig`` that choose which groups a step trains on (docs/sampling.md): DAPO's dynamic
sampling, an online difficulty curriculum and an adaptive group size. All off by default; ``GRPOConfig``
inherits them and ``validate_sampling_fields`` checks them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["SamplingFields", "validate_sampling_fields"]


@dataclass
class SamplingFields:
    """Dynamic sampling, curriculum and adaptive group size (see ``GRPOConfig``)."""

    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: drop groups whose rewards all agree (no learning signal) and sample further
    prompts until the step holds its configured number of groups, at most ``max_sampling_rounds``
    generation rounds; then train on the informative groups there are."""
    max_sampling_rounds: int = 4
    """Most generation rounds one step may take with ``dynamic_sampling`` (the first included)."""
    curriculum: bool = False
    """Online difficulty curriculum: estimate each training prompt's pass rate from its past groups and skip
    prompts that are (almost) always or never solved, except with probability ``curriculum_explore``."""
    curriculum_pass_threshold: float = 1.0
    """A completion *passes* when its (weighted) reward is at least this (curriculum and adaptive G)."""
    curriculum_min_pass_rate: float = 0.05
    """Skip a prompt whose estimated pass rate is below this (never solved)."""
    curriculum_max_pass_rate: float = 0.95
    """Skip a prompt whose estimated pass rate is above this (always solved)."""
    curriculum_min_samples: int = 8
    """Completions a prompt needs before its estimate is trusted enough to skip it."""
    curriculum_explore: float = 0.1
    """Probability that a prompt the curriculum would skip is trained anyway, so it comes back (and its
    estimate follows the policy)."""
    adaptive_num_generations: bool = False
    """Spread each step's completion budget (the ``generation_batch_size``) over its prompts by how uncertain
    their pass rate is: settled prompts get fewer samples, uncertain and unseen ones more, each between
    ``min_num_generations`` and ``max_num_generations``; advantages use each group's own size."""
    min_num_generations: int = 2
    """Smallest group with ``adaptive_num_generations`` (at least 2: a group of one has no baseline)."""
    max_num_generations: int | None = None
    """Largest group with ``adaptive_num_generations``; None: 2 x num_generations."""


def validate_sampling_fields(config: Any) -> None:
    """Each field's range and the combinations grpokit does not support, as ValueErrors naming the field."""
    from grpokit.config.validation import require

    require(config.max_sampling_rounds >= 1, "max_sampling_rounds", "must be >= 1")
    require(0 <= config.curriculum_min_pass_rate < 1, "curriculum_min_pass_rate", "must be in [0, 1)")
    require(
        config.curriculum_min_pass_rate < config.curriculum_max_pass_rate <= 1,
        "curriculum_max_pass_rate",
        "must be in (curriculum_min_pass_rate, 1]",
    )
    require(config.curriculum_min_samples >= 1, "curriculum_min_samples", "must be >= 1")
    require(0 < config.curriculum_explore <= 1, "curriculum_explore", "must be in (0, 1]: a skipped prompt "
            "must be able to come back")  # fmt: skip
    require(
        config.min_num_generations >= 2, "min_num_generations", "must be >= 2: a group of one has no baseline"
    )
    if config.max_num_generations is None:
        config.max_num_generations = 2 * config.num_generations
    require(
        config.max_num_generations >= config.min_num_generations,
        "max_num_generations",
        f"({config.max_num_generations}) must be >= min_num_generations ({config.min_num_generations})",
    )
    if config.adaptive_num_generations:
        require(
            not config.dynamic_sampling,
            "adaptive_num_generations",
            "and dynamic_sampling cannot be combined: adaptive groups already move samples to the prompts "
            "whose groups carry signal; choose one",
        )
        require(
            config.min_num_generations <= config.num_generations <= config.max_num_generations,
            "num_generations",
            f"({config.num_generations}) is the mean group size of adaptive_num_generations and must lie in "
            f"[min_num_generations, max_num_generations] = [{config.min_num_generations}, "
            f"{config.max_num_generations}]",
        )
