"""Which groups one GRPO step trains on (docs/sampling.md): steps 1-3 of the step, sample -> score ->
advantages, with the three options that choose the groups.

- plain: the step's prompts, G completions each, every group trained on (the paper);
- ``dynamic_sampling`` (DAPO): groups whose completions all get the same reward carry no signal and are
  dropped; further rounds of prompts are sampled until the step holds its configured number of groups, at
  most ``max_sampling_rounds`` rounds. The first ``prompts`` informative groups (in process order) are
  kept, rounded down to a multiple of the process count, and spread evenly over the processes, so every
  process trains on the same number of groups;
- ``adaptive_num_generations``: each process's completion budget is spread over its prompts by how
  uncertain their pass rate is (``core.allocate_group_sizes``); groups are ragged and advantages use each
  group's own size;
- ``curriculum``: the prompt order skips prompts that are (almost) always or never solved
  (``sampling.prompt_stats``); every sampled group updates the pass-rate estimates.

Global order is process-major: process 0's groups of every round, then process 1's, ... (the order in
which ``gather`` concatenates), so each process's rows are one contiguous slice.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from grpokit.core import allocate_group_sizes, combine_rewards, multi_reward_advantages
from grpokit.reporting.metrics import PhaseTimer
from grpokit.rollout.base import GenerationOutput
from grpokit.rollout.records import Samples, Scores
from grpokit.sampling.prompt_stats import Curriculum, PromptStats

logger = logging.getLogger(__name__)

__all__ = [
    "Draw",
    "GroupDrawer",
    "informative_groups",
    "prompt_statistics",
    "refill_count",
]


@dataclass
class Draw:
    """One step's groups: what it trains on, and everything it sampled (for logs and metrics)."""

    samples: Samples
    """This process's groups to train on."""
    scores: Scores
    """Rewards and advantages of the trained groups of every process ([N] kept rows, process-major)."""
    sampled: Samples
    """Every group this process sampled in the step (dropped ones included)."""
    sampled_scores: Scores
    """Rewards of everything sampled ([M] rows), ``kept`` marking the trained rows; a dropped row's
    advantage is 0 (it trains nothing)."""
    metrics: dict[str, float] = field(default_factory=dict)


def informative_groups(advantages: torch.Tensor, group_sizes: list[int]) -> list[bool]:
    """Whether each group has a non-zero advantage: centred within the group, the advantages are all 0
    exactly when its rewards all agree (or are all None). advantages: [N]; groups contiguous."""
    segment = torch.repeat_interleave(torch.arange(len(group_sizes)), torch.tensor(group_sizes))  # [N]
    nonzero = torch.zeros(len(group_sizes), dtype=torch.long)
    nonzero.index_add_(0, segment, (advantages.cpu() != 0).long())
    return (nonzero > 0).tolist()


class GroupDrawer:
    """Steps 1-3 of a ``GRPOTrainer`` step under the run's sampling options."""

    def __init__(self, trainer: Any) -> None:
        args = trainer.args
        if trainer.process is not None and (args.dynamic_sampling or args.adaptive_num_generations):
            option = "dynamic_sampling" if args.dynamic_sampling else "adaptive_num_generations"
            raise ValueError(
                f"GRPOConfig.{option} is not supported with process_reward_funcs: a group whose outcomes "
                "agree can still carry process signal, and process advantages take equal groups"
            )
        self.trainer = trainer
        self.args = args
        self.rounds = args.max_sampling_rounds if args.dynamic_sampling else 1

    # ------------------------------------------------------------------------------------------------
    def draw(self, timer: PhaseTimer, backend: Any = None) -> Draw:
        """The step's groups, sampled through ``backend`` (default: the trainer's sampler)."""
        t, accelerator = self.trainer, self.trainer.accelerator
        rounds: list[tuple[Samples, torch.Tensor, list[int], list[int], dict[str, float]]] = []
        informative, sampled, count = 0, 0, None  # count: prompts of this round (None: a step's)
        for _ in range(self.rounds):
            indices = t.prompts.next_local_indices(accelerator, count)
            rows = [t.train_rows[i] for i in indices]
            sizes = self._group_sizes(indices)
            with timer.phase("generate"):
                samples = t.sample(rows, group_sizes=sizes, backend=backend)
            with timer.phase("reward"):
                local, failures = t.reward_matrix(samples)  # [n, F]
                rewards = accelerator.gather(local.to(accelerator.device)).cpu()  # [P * n, F]
                all_sizes = self._gathered(sizes)
                all_indices = self._gathered(indices)
            rounds.append((samples, rewards, all_sizes, all_indices, failures))
            if not self.args.dynamic_sampling:  # one round: every group is trained on
                break
            informative += sum(informative_groups(self._advantages(rewards, all_sizes, "none"), all_sizes))
            sampled += len(all_sizes)
            if informative >= t.plan.prompts:
                break
            count = refill_count(t.plan.prompts - informative, informative / sampled, t.plan.prompts,
                                 accelerator.num_processes)  # fmt: skip
        with timer.phase("reward"):
            return self._assemble(rounds)

    def close(self) -> None:
        """Nothing runs in the background here (``sampling.async_draw.AsyncDrawer`` draws ahead)."""

    # ------------------------------------------------------------------------------------------------
    def _group_sizes(self, indices: list[int]) -> list[int]:
        """G for each of this process's prompts: num_generations, or the adaptive allocation."""
        args, t = self.args, self.trainer
        if not args.adaptive_num_generations:
            return [args.num_generations] * len(indices)
        rates = [t.prompt_stats.pass_rate(i) for i in indices]
        budget = args.num_generations * len(indices)  # this process's share of the step's completions
        return allocate_group_sizes(rates, budget, args.min_num_generations, args.max_num_generations)

    def _gathered(self, values: list[int]) -> list[int]:
        gather = self.trainer.gather
        return list(values) if gather is None else list(gather(list(values)))

    def _advantages(self, rewards: torch.Tensor, sizes: list[int], scale: str | None = None) -> torch.Tensor:
        t = self.trainer
        return multi_reward_advantages(
            rewards,
            t.reward_weights,
            group_sizes=sizes,
            scale=scale or self.args.scale_rewards,
            aggregation=self.args.multi_objective_aggregation,
            eps=self.args.advantage_epsilon,
        )

    def _assemble(self, rounds: list) -> Draw:
        """Every round's groups in process-major order; the kept ones, spread evenly; their scores."""
        t = self.trainer
        num_processes, rank = t.accelerator.num_processes, t.accelerator.process_index
        sampled = concat_samples([r[0] for r in rounds])
        # [P * n_r, F] per round -> process-major over the rounds: [P, sum n_r, F] -> [M, F]
        per_process = [
            r[1].reshape(num_processes, r[1].shape[0] // num_processes, r[1].shape[1]) for r in rounds
        ]
        rewards = torch.cat(per_process, 1).flatten(0, 1)  # [M, F] (F may be 0: process rewards only)
        sizes = _process_major([r[2] for r in rounds], num_processes)  # [groups]
        failures = {k: sum(r[4].get(k, 0.0) for r in rounds) for k in rounds[0][4]}
        if rewards.numel() and bool(rewards.isnan().all()):
            logger.warning(
                "step %d: every reward is None/NaN: the step carries no learning signal", t.step + 1
            )
        if t.prompt_stats is not None:  # every sampled group, kept or not, tells how hard its prompt is
            indices = _process_major([r[3] for r in rounds], num_processes)
            t.prompt_stats.update(indices, combine_rewards(rewards, t.reward_weights), sizes)
        kept = self._kept_groups(rewards, sizes, num_processes)
        starts = [0, *torch.tensor(sizes).cumsum(0).tolist()]  # first row of each group
        kept_rows = torch.tensor([r for g in kept for r in range(starts[g], starts[g + 1])], dtype=torch.long)
        kept_sizes = [sizes[g] for g in kept]
        kept_rewards = rewards[kept_rows]  # [N, F]
        advantages = self._advantages(kept_rewards, kept_sizes)  # [N]
        local = self._local_rows(kept_sizes, num_processes, rank)
        combined = combine_rewards(kept_rewards, t.reward_weights)
        scores = Scores(kept_rewards, combined, advantages, failures, local, group_sizes=kept_sizes)
        metrics = {  # gradient signal per generated completion: what dynamic sampling and adaptive G aim at
            "signal/frac_completions_nonzero_advantage": int((advantages != 0).sum()) / len(rewards),
            "signal/sampled_completions": float(len(rewards)),
        }
        if self.args.adaptive_num_generations:
            metrics |= {"adaptive/min_group": float(min(sizes)), "adaptive/max_group": float(max(sizes))}
        if not self.args.dynamic_sampling:  # every group is trained on: what was sampled is what is kept
            return Draw(sampled, scores, sampled, scores, metrics)
        metrics |= {
            "dynamic_sampling/rounds": float(len(rounds)),
            "dynamic_sampling/kept_groups": float(len(kept)),
            "dynamic_sampling/dropped_groups": float(len(sizes) - len(kept)),
        }
        kept_mask = torch.zeros(len(rewards), dtype=torch.bool)  # [M]
        kept_mask[kept_rows] = True
        trained = torch.zeros(len(rewards))  # [M] the advantage each row trains with (0: dropped)
        trained[kept_rows] = advantages.cpu().float()
        first = len(sampled.texts) * rank  # every process samples as many rows per round
        mine_sampled = slice(first, first + len(sampled.texts))
        combined = combine_rewards(rewards, t.reward_weights)
        sampled_scores = Scores(rewards, combined, trained, failures, mine_sampled, sizes, kept_mask)
        mine = self._my_groups(kept, sizes, num_processes, rank, sampled)
        return Draw(mine, scores, sampled, sampled_scores, metrics)

    def _kept_groups(self, rewards: torch.Tensor, sizes: list[int], num_processes: int) -> list[int]:
        """Every group without dynamic sampling; with it the first ``prompts`` informative groups, rounded
        down to a multiple of the process count."""
        if not self.args.dynamic_sampling:
            return list(range(len(sizes)))
        useful = informative_groups(self._advantages(rewards, sizes, "none"), sizes)
        informative = [g for g, ok in enumerate(useful) if ok][: self.trainer.plan.prompts]
        return informative[: len(informative) // num_processes * num_processes]

    def _my_groups(
        self, kept: list[int], sizes: list[int], num_processes: int, rank: int, sampled: Samples
    ) -> Samples:
        """This process's share of the kept groups: the k-th block of len(kept)/P groups. When that is not
        what this process sampled, the groups' samples are gathered from every process."""
        share = len(kept) // num_processes
        wanted = kept[rank * share : (rank + 1) * share]
        per_process = len(sizes) // num_processes
        own = range(rank * per_process, (rank + 1) * per_process)
        if num_processes > 1 and (len(kept) != len(sizes)):
            everything = self.trainer.gather(_group_payloads(sampled))  # every process's groups, in order
            return _samples_from_payloads([everything[g] for g in wanted])
        return select_groups(sampled, [g - own.start for g in wanted])

    @staticmethod
    def _local_rows(kept_sizes: list[int], num_processes: int, rank: int) -> slice:
        share = len(kept_sizes) // num_processes
        first = sum(kept_sizes[: rank * share])
        return slice(first, first + sum(kept_sizes[rank * share : (rank + 1) * share]))


# ----------------------------------------------------------------------------------------------------
def refill_count(missing: int, informative_rate: float, step_prompts: int, num_processes: int) -> int:
    """Prompts to sample in the next round of dynamic sampling: enough to expect the ``missing`` informative
    groups at the rate seen so far in this step (at least 10%), rounded up to a multiple of the process
    count, at most a whole step's. Smaller than DAPO's whole-batch rounds, so fewer informative groups are
    sampled only to be dropped beyond the batch."""
    expected = math.ceil(missing / max(informative_rate, 0.1))
    return min(step_prompts, math.ceil(expected / num_processes) * num_processes)


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
    )
    return Samples(
        [row for p in parts for row in p.rows],
        [ids for p in parts for ids in p.prompt_ids],
        generated,
        [text for p in parts for text in p.texts],
        group_sizes=[g for p in parts for g in p.sizes()],
        episodes=_joined([p.episodes for p in parts]),
    )


def _joined(lists: list[list[Any] | None]) -> list[Any] | None:
    """The lists one after another; None when any is None (a field only some parts have is dropped)."""
    return None if any(x is None for x in lists) else [item for x in lists for item in x]


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
            "episodes": None if samples.episodes is None else samples.episodes[rows],
            "texts": samples.texts[rows],
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
    )
    return Samples(
        [row for g in groups for row in g["rows"]],
        [g["prompt_ids"] for g in groups],
        generated,
        [text for g in groups for text in g["texts"]],
        group_sizes=[len(g["texts"]) for g in groups],
        episodes=_joined([g["episodes"] for g in groups]) if groups else None,
    )


def prompt_statistics(args: Any, num_rows: int) -> tuple[PromptStats | None, Curriculum | None]:
    """The per-prompt pass-rate estimates the run needs (curriculum or adaptive group sizes), and the
    curriculum reading them."""
    if not (args.curriculum or args.adaptive_num_generations):
        return None, None
    stats = PromptStats(num_rows, args.curriculum_pass_threshold)
    curriculum = Curriculum.from_config(args, num_rows, stats=stats) if args.curriculum else None
    return stats, curriculum
