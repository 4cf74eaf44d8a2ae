"""Which groups one GRPO step trains on (docs/sampling.md): rounds of the plain draw, joined, and the choice
of the groups to train on.

The plain draw (``GRPOTrainer.draw_round``) is steps 1-2 once: this process's prompts, G completions each,
their reward matrix, and every process's rewards. Around it:

- plain: one round, every group trained on (the paper);
- ``dynamic_sampling`` (DAPO), a filter: groups whose completions all get the same reward carry no signal
  and are dropped; further rounds are drawn until the step holds its configured number of groups, at most
  ``max_sampling_rounds`` rounds. The first ``prompts`` informative groups (in process order) are kept,
  rounded down to a multiple of the process count, and spread evenly over the processes, so every process
  trains on the same number of groups;
- ``adaptive_num_generations`` (:class:`GroupSizes`): each process's completion budget is spread over its
  prompts by how uncertain their pass rate is (``core.allocate_group_sizes``); groups are ragged and
  advantages use each group's own size;
- ``curriculum``: the prompt order skips prompts that are (almost) always or never solved
  (``sampling.prompt_stats``); every drawn group updates the pass-rate estimates.

Global order is process-major: process 0's groups of every round, then process 1's, ... (the order in
which ``gather`` concatenates), so each process's rows are one contiguous slice.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from grpokit.core import allocate_group_sizes, combine_rewards, multi_reward_advantages, role_group_sizes
from grpokit.models.vision import PromptImages
from grpokit.reporting.metrics import PhaseTimer
from grpokit.rollout.base import GenerationOutput, RolloutBackend
from grpokit.rollout.records import Samples, Scores
from grpokit.sampling.prompt_stats import Curriculum, PromptStats

logger = logging.getLogger(__name__)

__all__ = [
    "DrawRound",
    "DrawSettings",
    "Drawn",
    "GroupDrawer",
    "GroupSizes",
    "KeptGroups",
    "Round",
    "informative_groups",
    "join_rounds",
    "prompt_statistics",
    "refill_count",
]

Gather = Callable[[list[Any]], list[Any]]
"""Concatenates a list from every process, in process order (``parallel.distributed``)."""


@dataclass
class Round:
    """One plain draw: this process's groups and the rewards of every process's."""

    samples: Samples
    """This process's n completions (k groups)."""
    rewards: torch.Tensor
    """[P * n, F] every process's reward matrix, in process order (NaN where a function returned None)."""
    group_sizes: list[int]
    """[P * k] every process's group sizes, in process order."""
    prompt_indices: list[int]
    """[P * k] the training rows the groups were drawn for."""
    failures: dict[str, float]
    """``rewards/<name>/failures`` on this process."""
    logged: dict[str, float] = field(default_factory=dict)
    """The metrics reward functions logged with ``log_metric`` (their means over the round's calls)."""


class DrawRound(Protocol):
    """The plain draw: this process's share of the next ``count`` prompts of all processes (None: a step's),
    G completions each through ``backend`` (None: the run's sampler), scored."""

    def __call__(
        self, count: int | None, timer: PhaseTimer, backend: RolloutBackend | None = None
    ) -> Round: ...


@dataclass
class Drawn:
    """Steps 1-2 of one step: every round's groups, process-major (M rows over all processes)."""

    samples: Samples
    """This process's groups of every round, in order."""
    rewards: torch.Tensor
    """[M, F] every process's rewards, process-major."""
    group_sizes: list[int]
    prompt_indices: list[int]
    failures: dict[str, float]
    """Summed over the rounds."""
    rounds: int
    metrics: dict[str, float] = field(default_factory=dict)
    """What drawing adds to the step's metrics (``async/staleness``)."""


@dataclass
class KeptGroups:
    """The drawn groups a step trains on."""

    groups: list[int]
    """Indices into the drawn groups (process-major)."""
    rows: torch.Tensor
    """[N] long: their rows among the M drawn."""
    sizes: list[int]
    rewards: torch.Tensor
    """[N, F] their rewards."""


@dataclass(frozen=True)
class DrawSettings:
    """What decides a step's groups (the sampling fields of ``GRPOConfig``)."""

    prompts: int
    """Groups a step trains on, all processes together (``BatchPlan.prompts``)."""
    dynamic_sampling: bool = False
    max_rounds: int = 1
    """Plain draws a step may make (``max_sampling_rounds`` with dynamic sampling, else 1)."""
    adaptive_group_sizes: bool = False
    aggregation: str = "sum_then_normalize"
    """``multi_objective_aggregation``: how several rewards make an advantage (which groups are flat)."""
    advantage_epsilon: float = 1e-4
    roles: int = 1
    """A game's roles: each prompt's group holds that many role groups (``grpokit.envs.selfplay``); 1
    otherwise."""

    @classmethod
    def from_config(
        cls, args: Any, prompts: int, *, process_rewards: bool = False, roles: int = 1
    ) -> DrawSettings:
        """The settings of a ``GRPOConfig``. Dynamic sampling and adaptive G are refused with process rewards
        (``process_rewards``); adaptive G with a game (``roles`` > 1: its groups split by role)."""
        if roles > 1 and args.adaptive_num_generations:
            raise ValueError(
                "GRPOConfig.adaptive_num_generations is not supported with a game: a prompt's episodes are "
                f"its {roles} roles' seats, num_generations / {roles} each"
            )
        if process_rewards and (args.dynamic_sampling or args.adaptive_num_generations):
            option = "dynamic_sampling" if args.dynamic_sampling else "adaptive_num_generations"
            raise ValueError(
                f"GRPOConfig.{option} is not supported with process_reward_funcs: a group whose outcomes "
                "agree can still carry process signal, and process advantages take equal groups"
            )
        return cls(
            prompts=prompts,
            dynamic_sampling=args.dynamic_sampling,
            max_rounds=args.max_sampling_rounds if args.dynamic_sampling else 1,
            adaptive_group_sizes=args.adaptive_num_generations,
            aggregation=args.multi_objective_aggregation,
            advantage_epsilon=args.advantage_epsilon,
            roles=roles,
        )


@dataclass(frozen=True)
class GroupSizes:
    """G for each of a round's prompts on this process: ``num_generations``, or with adaptive group sizes
    this process's budget of ``num_generations`` per prompt spread by the prompts' pass rates."""

    num_generations: int
    stats: PromptStats | None = None
    """The pass-rate estimates (adaptive group sizes); None: every group has ``num_generations``."""
    min_size: int = 2
    max_size: int | None = None

    @classmethod
    def from_config(cls, args: Any, stats: PromptStats | None) -> GroupSizes:
        if not args.adaptive_num_generations:
            return cls(args.num_generations)
        return cls(args.num_generations, stats, args.min_num_generations, args.max_num_generations)

    def __call__(self, indices: Sequence[int]) -> list[int]:
        if self.stats is None:
            return [self.num_generations] * len(indices)
        rates = [self.stats.pass_rate(i) for i in indices]
        budget = self.num_generations * len(indices)  # this process's share of the step's completions
        return allocate_group_sizes(rates, budget, self.min_size, self.max_size)


def informative_groups(advantages: torch.Tensor, group_sizes: list[int]) -> list[bool]:
    """Whether each group has a non-zero advantage: centred within the group, the advantages are all 0
    exactly when its rewards all agree (or are all None). advantages: [N]; groups contiguous."""
    segment = torch.repeat_interleave(torch.arange(len(group_sizes)), torch.tensor(group_sizes))  # [N]
    nonzero = torch.zeros(len(group_sizes), dtype=torch.long)
    nonzero.index_add_(0, segment, (advantages.cpu() != 0).long())
    return (nonzero > 0).tolist()


class GroupDrawer:
    """Steps 1-2 of every step under the run's sampling options (module docstring), and which of the drawn
    groups the step trains on.

    ``draw_round``: the plain draw. ``reward_weights``: [F]. ``rank``, ``num_processes``: this process and
    how many there are; ``gather``: lists from every process (None with one process). ``prompt_stats``:
    the pass-rate estimates every drawn group updates (curriculum, adaptive G), or None."""

    def __init__(
        self,
        draw_round: DrawRound,
        settings: DrawSettings,
        reward_weights: torch.Tensor,
        *,
        rank: int = 0,
        num_processes: int = 1,
        gather: Gather | None = None,
        prompt_stats: PromptStats | None = None,
    ) -> None:
        self.draw_round, self.settings, self.reward_weights = draw_round, settings, reward_weights
        self.rank, self.num_processes, self.gather = rank, num_processes, gather
        self.prompt_stats = prompt_stats

    def draw(self, timer: PhaseTimer, backend: RolloutBackend | None = None) -> Drawn:
        """One plain draw; with dynamic sampling, more until the step holds enough informative groups.
        ``backend``: the sampler (default: the plain draw's)."""
        settings = self.settings
        rounds: list[Round] = []
        informative, sampled, count = 0, 0, None  # count: prompts of the next round (None: a step's)
        for _ in range(settings.max_rounds):
            drawn = self.draw_round(count, timer, backend)
            rounds.append(drawn)
            if not settings.dynamic_sampling:
                break
            informative += sum(self._informative(drawn.rewards, drawn.group_sizes))
            sampled += len(drawn.group_sizes)
            if informative >= settings.prompts:
                break
            count = refill_count(settings.prompts - informative, informative / sampled, settings.prompts,
                                 self.num_processes)  # fmt: skip
        with timer.phase("reward"):
            joined = join_rounds(rounds, self.num_processes)
            if self.prompt_stats is not None:  # every drawn group, kept or not, tells how hard its prompt is
                combined = combine_rewards(joined.rewards, self.reward_weights)  # [M]
                self.prompt_stats.update(joined.prompt_indices, combined, joined.group_sizes)
        return joined

    def close(self) -> None:
        """Nothing runs in the background here (``sampling.async_draw.AsyncDrawer`` draws ahead)."""

    # ------------------------------------------------------------------------------------------------
    def kept_groups(self, drawn: Drawn) -> KeptGroups:
        """Every group; with dynamic sampling the first ``prompts`` informative groups, rounded down to a
        multiple of the process count."""
        sizes = drawn.group_sizes
        groups = list(range(len(sizes)))
        if self.settings.dynamic_sampling:
            useful = self._informative(drawn.rewards, sizes)
            informative = [g for g in groups if useful[g]][: self.settings.prompts]
            groups = informative[: len(informative) // self.num_processes * self.num_processes]
        starts = [0, *torch.tensor(sizes).cumsum(0).tolist()]  # first row of each group
        rows = torch.tensor([r for g in groups for r in range(starts[g], starts[g + 1])], dtype=torch.long)
        return KeptGroups(groups, rows, [sizes[g] for g in groups], drawn.rewards[rows])

    def scores(
        self, drawn: Drawn, kept: KeptGroups, advantages: torch.Tensor, step: int
    ) -> tuple[Scores, Scores]:
        """``(trained, drawn)``: the Scores of the kept groups ([N] rows, this process's share ``local``)
        and of everything drawn ([M] rows; with dynamic sampling ``kept`` marks the trained rows and a
        dropped row's advantage is 0). advantages: [N]; ``step``: the step's number (for its warning)."""
        if drawn.rewards.numel() and bool(drawn.rewards.isnan().all()):
            logger.warning("step %d: every reward is None/NaN: the step carries no learning signal", step)
        weights, rank, num_processes = self.reward_weights, self.rank, self.num_processes
        share = len(kept.sizes) // num_processes
        first = sum(kept.sizes[: rank * share])
        local = slice(first, first + sum(kept.sizes[rank * share : (rank + 1) * share]))
        combined = combine_rewards(kept.rewards, weights)  # [N]
        trained = Scores(kept.rewards, combined, advantages, drawn.failures, local, group_sizes=kept.sizes)
        if not self.settings.dynamic_sampling:  # every group is trained on: what was drawn is what is kept
            return trained, trained
        rows = len(drawn.rewards)
        kept_mask = torch.zeros(rows, dtype=torch.bool)  # [M]
        kept_mask[kept.rows] = True
        trained_advantages = torch.zeros(rows)  # [M] the advantage each row trains with (0: dropped)
        trained_advantages[kept.rows] = advantages.cpu().float()
        mine = len(drawn.samples.texts)  # every process draws as many rows per round
        combined = combine_rewards(drawn.rewards, weights)  # [M]
        everything = Scores(drawn.rewards, combined, trained_advantages, drawn.failures,
                            slice(mine * rank, mine * (rank + 1)), drawn.group_sizes, kept_mask)  # fmt: skip
        return trained, everything

    def local_groups(self, drawn: Drawn, kept: KeptGroups) -> Samples:
        """This process's share of the kept groups: the k-th block of len(kept)/P groups. When that is not
        what this process drew, the groups' samples are gathered from every process."""
        if not self.settings.dynamic_sampling:
            return drawn.samples
        rank, num_processes = self.rank, self.num_processes
        share = len(kept.groups) // num_processes
        wanted = kept.groups[rank * share : (rank + 1) * share]
        if num_processes > 1 and len(kept.groups) != len(drawn.group_sizes):
            everything = self.gather(_group_payloads(drawn.samples))  # every process's groups, in order
            return _samples_from_payloads([everything[g] for g in wanted])
        own_start = rank * (len(drawn.group_sizes) // num_processes)
        return select_groups(drawn.samples, [g - own_start for g in wanted])

    def metrics(self, drawn: Drawn, kept: KeptGroups, advantages: torch.Tensor) -> dict[str, float]:
        """Gradient signal per drawn completion (what dynamic sampling and adaptive G aim at), the group
        sizes (adaptive G), the rounds and kept/dropped groups (dynamic sampling)."""
        rows, sizes = len(drawn.rewards), drawn.group_sizes
        metrics = {
            "signal/frac_completions_nonzero_advantage": int((advantages != 0).sum()) / rows,
            "signal/sampled_completions": float(rows),
        }
        if self.settings.adaptive_group_sizes:
            metrics |= {"adaptive/min_group": float(min(sizes)), "adaptive/max_group": float(max(sizes))}
        if self.settings.dynamic_sampling:
            metrics |= {
                "dynamic_sampling/rounds": float(drawn.rounds),
                "dynamic_sampling/kept_groups": float(len(kept.groups)),
                "dynamic_sampling/dropped_groups": float(len(sizes) - len(kept.groups)),
            }
        return metrics

    def _informative(self, rewards: torch.Tensor, sizes: list[int]) -> list[bool]:
        """Which groups' rewards differ: non-zero centred advantages (no scaling; a game's within a role)."""
        roles = self.settings.roles
        parts = role_group_sizes(sizes, roles)
        advantages = multi_reward_advantages(
            rewards, self.reward_weights, group_sizes=parts, scale="none",
            aggregation=self.settings.aggregation, eps=self.settings.advantage_epsilon,
        )  # fmt: skip
        useful = informative_groups(advantages, parts)
        return [any(useful[g * roles : (g + 1) * roles]) for g in range(len(sizes))]


# ----------------------------------------------------------------------------------------------------
def refill_count(missing: int, informative_rate: float, step_prompts: int, num_processes: int) -> int:
    """Prompts to sample in the next round of dynamic sampling: enough to expect the ``missing`` informative
    groups at the rate seen so far in this step (at least 10%), rounded up to a multiple of the process
    count, at most a whole step's. Smaller than DAPO's whole-batch rounds, so fewer informative groups are
    sampled only to be dropped beyond the batch."""
    expected = math.ceil(missing / max(informative_rate, 0.1))
    return min(step_prompts, math.ceil(expected / num_processes) * num_processes)


def join_rounds(rounds: list[Round], num_processes: int) -> Drawn:
    """Every round's groups in process-major order: this process's samples one after another, every
    process's rewards, sizes and prompt indices reordered from [round][process] to [process][round]."""
    # [P * n_r, F] per round -> [P, n_r, F] (F may be 0: process rewards only) -> [P, sum n_r, F] -> [M, F]
    per_process = [r.rewards.unflatten(0, (num_processes, len(r.rewards) // num_processes)) for r in rounds]
    rewards = torch.cat(per_process, 1).flatten(0, 1)  # [M, F]
    failures = {k: sum(r.failures.get(k, 0.0) for r in rounds) for k in rounds[0].failures}
    logged: dict[str, list[float]] = {}  # log_metric means of the rounds that logged each metric
    for r in rounds:
        for name, value in r.logged.items():
            logged.setdefault(name, []).append(value)
    return Drawn(
        samples=concat_samples([r.samples for r in rounds]),
        rewards=rewards,
        group_sizes=_process_major([r.group_sizes for r in rounds], num_processes),
        prompt_indices=_process_major([r.prompt_indices for r in rounds], num_processes),
        failures=failures,
        rounds=len(rounds),
        metrics={name: sum(values) / len(values) for name, values in logged.items()},
    )


def _process_major(per_round: list[list[int]], num_processes: int) -> list[int]:
    """Per-round lists in process order ([P * k_r] each) -> one list, process-major over the rounds."""
    out: list[int] = []
    for p in range(num_processes):
        for values in per_round:
            k = len(values) // num_processes
            out += values[p * k : (p + 1) * k]
    return out


def concat_samples(parts: list[Samples]) -> Samples:
    """The groups of several Samples, in order."""
    if len(parts) == 1:
        return parts[0]
    logprobs = None
    if all(p.generated.logprobs is not None for p in parts):
        logprobs = [lp for p in parts for lp in p.generated.logprobs]
    generated = GenerationOutput(
        [ids for p in parts for ids in p.generated.completion_ids],
        logprobs,
        [flag for p in parts for flag in (p.generated.truncated or [False] * len(p.texts))],
        policy_mask=_joined([p.generated.policy_mask for p in parts]),
        routed_experts=_joined([p.generated.routed_experts for p in parts]),
    )
    return Samples(
        [row for p in parts for row in p.rows],
        [ids for p in parts for ids in p.prompt_ids],
        generated,
        [text for p in parts for text in p.texts],
        group_sizes=[g for p in parts for g in p.sizes()],
        episodes=_joined([p.episodes for p in parts]),
        extra=_joined_columns([p.extra for p in parts], [len(p.texts) for p in parts]),
        images=_joined_images([p.images for p in parts], [p.sizes() for p in parts]),
    )


def _joined_images(parts: list[PromptImages | None], sizes: list[list[int]]) -> PromptImages | None:
    """The image inputs of several parts' prompts, one after another (None: no part has images)."""
    if all(p is None for p in parts):
        return None
    tensors = [t for p, s in zip(parts, sizes) for t in (p.tensors if p is not None else [None] * len(s))]
    key = next(p.token_type_key for p in parts if p is not None)
    return PromptImages.of_prompts(tensors, [g for s in sizes for g in s], key)


def _joined(lists: list[list[Any] | None]) -> list[Any] | None:
    """The lists one after another; None when any is None (a field only some parts have is dropped)."""
    return None if any(x is None for x in lists) else [item for x in lists for item in x]


def _joined_columns(
    parts: list[dict[str, list[Any]] | None], lengths: list[int]
) -> dict[str, list[Any]] | None:
    """Logged columns of several parts, one after another; a column a part lacks is None on its rows."""
    names = list(dict.fromkeys(name for p in parts if p for name in p))
    if not names:
        return None
    return {
        name: [v for p, n in zip(parts, lengths) for v in ((p or {}).get(name) or [None] * n)]
        for name in names
    }


def select_groups(samples: Samples, groups: list[int]) -> Samples:
    """Groups ``groups`` (indices into this Samples' groups) of ``samples``, in that order."""
    return _samples_from_payloads([_group_payloads(samples)[g] for g in groups])


def _group_payloads(samples: Samples) -> list[dict[str, Any]]:
    """One plain dict per group (picklable, for gathering across processes)."""
    out, start = [], 0
    generated = samples.generated
    for k, size in enumerate(samples.sizes()):
        rows = slice(start, start + size)
        out.append({
            "rows": samples.rows[rows],  # episodes add per-completion columns: rows differ within a group
            "prompt_ids": samples.prompt_ids[k],
            "completion_ids": generated.completion_ids[rows],
            "logprobs": None if generated.logprobs is None else generated.logprobs[rows],
            "truncated": (generated.truncated or [False] * len(samples.texts))[rows],
            "policy_mask": None if generated.policy_mask is None else generated.policy_mask[rows],
            "routed_experts": None if generated.routed_experts is None else generated.routed_experts[rows],
            "episodes": None if samples.episodes is None else samples.episodes[rows],
            "texts": samples.texts[rows],
            "extra": None if samples.extra is None else {k: v[rows] for k, v in samples.extra.items()},
            "images": None if samples.images is None else (samples.images.tensors[k],
                                                           samples.images.token_type_key),
        })  # fmt: skip
        start += size
    return out


def _samples_from_payloads(groups: list[dict[str, Any]]) -> Samples:
    logprobs = None
    if groups and all(g["logprobs"] is not None for g in groups):
        logprobs = [lp for g in groups for lp in g["logprobs"]]
    generated = GenerationOutput(
        [ids for g in groups for ids in g["completion_ids"]],
        logprobs,
        [flag for g in groups for flag in g["truncated"]],
        policy_mask=_joined([g["policy_mask"] for g in groups]) if groups else None,
        routed_experts=_joined([g["routed_experts"] for g in groups]) if groups else None,
    )
    return Samples(
        [row for g in groups for row in g["rows"]],
        [g["prompt_ids"] for g in groups],
        generated,
        [text for g in groups for text in g["texts"]],
        group_sizes=[len(g["texts"]) for g in groups],
        episodes=_joined([g["episodes"] for g in groups]) if groups else None,
        extra=_joined_columns([g["extra"] for g in groups], [len(g["texts"]) for g in groups]),
        images=_images_of_payloads(groups),
    )


def _images_of_payloads(groups: list[dict[str, Any]]) -> PromptImages | None:
    """The image inputs of the groups' prompts (None when no group's prompt has images)."""
    with_images = [g["images"] for g in groups if g["images"] is not None]
    if not with_images:
        return None
    tensors = [None if g["images"] is None else g["images"][0] for g in groups]
    return PromptImages.of_prompts(tensors, [len(g["texts"]) for g in groups], with_images[0][1])


def prompt_statistics(args: Any, num_rows: int) -> tuple[PromptStats | None, Curriculum | None]:
    """The per-prompt pass-rate estimates the run needs (curriculum or adaptive group sizes), and the
    curriculum reading them."""
    if not (args.curriculum or args.adaptive_num_generations):
        return None, None
    stats = PromptStats(num_rows, args.curriculum_pass_threshold)
    curriculum = Curriculum.from_config(args, num_rows, stats=stats) if args.curriculum else None
    return stats, curriculum
