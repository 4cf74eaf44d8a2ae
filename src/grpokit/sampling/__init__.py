"""How a step's groups are drawn: rounds of the plain draw, the groups kept, prompt order and G, draws ahead.

Modules: ``groups`` (rounds of ``GRPOTrainer.draw_round`` joined, the groups a step trains on, G of each
prompt), ``prompt_stats`` (per-prompt pass rates and the curriculum over them), ``async_draw`` (drawing
ahead in the background) and ``off_policy`` (the run's sampler and its importance-sampling correction).
"""

from grpokit.sampling.groups import Drawn, GroupDrawer, GroupSizes, KeptGroups, Round, informative_groups
from grpokit.sampling.off_policy import OffPolicyCorrection, make_sampler
from grpokit.sampling.prompt_stats import Curriculum, PromptStats

__all__ = [
    "Curriculum",
    "Drawn",
    "GroupDrawer",
    "GroupSizes",
    "KeptGroups",
    "OffPolicyCorrection",
    "PromptStats",
    "Round",
    "informative_groups",
    "make_sampler",
]
