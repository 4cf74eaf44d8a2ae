"""How a step's groups are drawn: the plain draw and dynamic sampling's filter (``groups``), per-prompt pass
rates and the curriculum over them (``prompt_stats``), drawing ahead in the background (``async_draw``), and
a sampler that is not pi_old with its importance-sampling correction (``off_policy``)."""

from grpokit.sampling.groups import Draw, GroupDrawer, informative_groups
from grpokit.sampling.off_policy import OffPolicyCorrection, make_sampler
from grpokit.sampling.prompt_stats import Curriculum, PromptStats

__all__ = [
    "Curriculum",
    "Draw",
    "GroupDrawer",
    "OffPolicyCorrection",
    "PromptStats",
    "informative_groups",
    "make_sampler",
]
