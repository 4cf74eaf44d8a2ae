"""Per-prompt pass rates, and the online difficulty curriculum built on them (docs/sampling.md).

``PromptStats`` counts, for each training row, the completions that got a reward and those that *passed*
(weighted reward >= ``curriculum_pass_threshold``), and estimates the row's pass rate. ``Curriculum`` uses
the estimates to skip prompts that are (almost) always or never solved, with an exploration floor so a
skipped prompt comes back; ``PromptSampler`` consults it when it picks a step's prompts. The same estimates
size the groups of ``adaptive_num_generations`` (``grpokit.core.allocate_group_sizes``).

Every process must hold identical statistics (update them from rewards gathered over all processes, with the
step's global row indices), so the curriculum decides identically everywhere without communicating.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["Curriculum", "PromptStats"]


class PromptStats:
    """Completions seen ``n_i`` and passed ``s_i`` per training-row index i.

    A completion passes when its weighted reward is >= ``pass_threshold``. A NaN reward (no reward
    function applied: ``combine_rewards`` of an all-None row) says nothing about the prompt's difficulty,
    so it is not counted at all: neither seen nor passed.
    """

    def __init__(self, num_rows: int, pass_threshold: float) -> None:
        if num_rows < 0:
            raise ValueError(f"num_rows must be >= 0, got {num_rows}")
        self.num_rows = num_rows
        self.pass_threshold = float(pass_threshold)
        self._seen: dict[int, int] = {}  # only rows with at least one counted completion
        self._passed: dict[int, int] = {}

    def update(self, indices: Sequence[int], rewards: torch.Tensor, group_sizes: Sequence[int]) -> None:
        """Count one step's groups: group j holds the ``group_sizes[j]`` contiguous entries of ``rewards``
        ([N] weighted rewards, N = sum of the sizes, NaN = no reward) and belongs to row ``indices[j]``.
        A row may appear in several groups."""
        if len(indices) != len(group_sizes):
            raise ValueError(
                f"indices ({len(indices)}) and group_sizes ({len(group_sizes)}) must have one entry per group"
            )
        if rewards.dim() != 1 or rewards.numel() != sum(group_sizes):
            raise ValueError(
                f"rewards must be [N] with N = sum(group_sizes) = {sum(group_sizes)}, "
                f"got shape {tuple(rewards.shape)}"
            )
        if any(size < 0 for size in group_sizes):
            raise ValueError(f"group_sizes must be >= 0, got {list(group_sizes)}")
        for index in indices:
            self._check_index(index)
        if not indices:
            return
        r = rewards.detach().to("cpu", torch.float64)
        groups = len(group_sizes)
        group = torch.repeat_interleave(torch.arange(groups), torch.tensor(list(group_sizes)))  # [N]
        counted = torch.bincount(group, weights=(~r.isnan()).double(), minlength=groups)
        passed = torch.bincount(group, weights=(r >= self.pass_threshold).double(), minlength=groups)
        for index, n, s in zip(indices, counted.long().tolist(), passed.long().tolist()):
            if n:
                index = int(index)
                self._seen[index] = self._seen.get(index, 0) + n
                self._passed[index] = self._passed.get(index, 0) + s

    def seen(self, index: int) -> int:
        """Completions of row ``index`` that got a reward (n_i)."""
        return self._seen.get(index, 0)

    def passed(self, index: int) -> int:
        """Completions of row ``index`` that passed (s_i)."""
        return self._passed.get(index, 0)

    def pass_rate(self, index: int) -> float | None:
        """The posterior mean pass rate under a uniform Beta(1, 1) prior, (s + 1) / (n + 2); None when the
        row has no counted completion yet. Never exactly 0 or 1."""
        n = self._seen.get(index, 0)
        return None if n == 0 else (self._passed[index] + 1) / (n + 2)

    def pass_rates(self, indices: Sequence[int]) -> list[float | None]:
        """``pass_rate`` of each index (what ``allocate_group_sizes`` takes)."""
        return [self.pass_rate(int(i)) for i in indices]

    @property
    def tracked(self) -> int:
        """Rows with at least one counted completion."""
        return len(self._seen)

    def _check_index(self, index: int) -> None:
        if not 0 <= int(index) < self.num_rows:
            raise ValueError(f"row index {index} is out of range for {self.num_rows} training rows")

    def state_dict(self) -> dict[str, Any]:
        """Plain Python values (ints, floats, lists of ints; JSON- and ``torch.load(weights_only=True)``-
        safe); only the tracked rows are listed."""
        tracked = sorted(self._seen)
        return {
            "num_rows": self.num_rows,
            "pass_threshold": self.pass_threshold,
            "indices": tracked,
            "seen": [self._seen[i] for i in tracked],
            "passed": [self._passed[i] for i in tracked],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``'s counts; ValueError when they were taken on another number of rows."""
        if int(state["num_rows"]) != self.num_rows:
            raise ValueError(
                f"resume_from_checkpoint: the prompt statistics were saved for {state['num_rows']} training "
                f"rows, this run has {self.num_rows}; the curriculum needs the same training data"
            )
        self.pass_threshold = float(state["pass_threshold"])
        indices = [int(i) for i in state["indices"]]
        self._seen = dict(zip(indices, (int(n) for n in state["seen"]), strict=True))
        self._passed = dict(zip(indices, (int(s) for s in state["passed"]), strict=True))


class Curriculum:
    """Online difficulty curriculum: skip prompts whose estimated pass rate is settled outside
    [``min_pass_rate``, ``max_pass_rate``], except with probability ``explore``.

    A prompt is accepted unless it has at least ``min_samples`` counted completions and its estimate is
    below ``min_pass_rate`` (too hard) or above ``max_pass_rate`` (too easy); such a prompt is still accepted
    with probability ``explore``, drawn from the curriculum's own generator (seeded with ``seed``, the run's
    ``seed``). Draws happen only for prompts that would be skipped, so given identical statistics every
    process makes the same draws and the same decisions.

    Counters (``metrics``) count the decisions since the previous ``metrics()`` call, which resets them:
    read once per step, they are per-step counts.
    """

    def __init__(
        self,
        stats: PromptStats,
        *,
        min_pass_rate: float,
        max_pass_rate: float,
        min_samples: int,
        explore: float,
        seed: int,
    ) -> None:
        if not 0 <= min_pass_rate < max_pass_rate <= 1:
            raise ValueError(
                f"need 0 <= min_pass_rate < max_pass_rate <= 1, got {min_pass_rate} and {max_pass_rate}"
            )
        if not 0 <= explore <= 1:
            raise ValueError(f"explore must be in [0, 1], got {explore}")
        self.stats = stats
        self.min_pass_rate, self.max_pass_rate = min_pass_rate, max_pass_rate
        self.min_samples, self.explore = min_samples, explore
        self.generator = torch.Generator().manual_seed(seed)
        self._counts = {"skipped_easy": 0, "skipped_hard": 0, "explored": 0, "forced": 0}

    @classmethod
    def from_config(cls, args: Any, num_rows: int, stats: PromptStats | None = None) -> Curriculum:
        """The curriculum ``args`` (a ``GRPOConfig``) describes over ``num_rows`` training rows; ``stats``:
        share existing statistics (e.g. with ``adaptive_num_generations``), else new ones."""
        if stats is None:
            stats = PromptStats(num_rows, args.curriculum_pass_threshold)
        elif stats.num_rows != num_rows:
            raise ValueError(f"stats cover {stats.num_rows} rows, the training data has {num_rows}")
        return cls(
            stats,
            min_pass_rate=args.curriculum_min_pass_rate,
            max_pass_rate=args.curriculum_max_pass_rate,
            min_samples=args.curriculum_min_samples,
            explore=args.curriculum_explore,
            seed=args.seed,
        )

    def verdict(self, index: int) -> str | None:
        """``"easy"`` / ``"hard"`` when the curriculum would skip row ``index`` (before exploring); None."""
        rate = self.stats.pass_rate(index)
        if rate is None or self.stats.seen(index) < self.min_samples:
            return None
        if rate > self.max_pass_rate:
            return "easy"
        if rate < self.min_pass_rate:
            return "hard"
        return None

    def accepts(self, index: int) -> bool:
        """Whether the step may train on row ``index``; counts the decision (see ``metrics``)."""
        verdict = self.verdict(index)
        if verdict is None:
            return True
        if torch.rand((), generator=self.generator).item() < self.explore:
            self._counts["explored"] += 1
            return True
        self._counts[f"skipped_{verdict}"] += 1
        return False

    def note_forced(self) -> None:
        """Count a prompt taken without asking (``PromptSampler``'s guard against endless rejection)."""
        self._counts["forced"] += 1

    def metrics(self) -> dict[str, float]:
        """Decisions since the previous call (which this one resets): prompts skipped as too easy / too
        hard, skipped ones taken anyway by exploration, ones the sampler forced after a full pass of
        rejections; and the rows with statistics so far."""
        counts, self._counts = self._counts, dict.fromkeys(self._counts, 0)
        metrics = {f"curriculum/{name}": float(value) for name, value in counts.items()}
        metrics["curriculum/tracked_prompts"] = float(self.stats.tracked)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """The statistics and the generator's state (a uint8 tensor): loadable with
        ``torch.load(weights_only=True)``. The per-step counters are not saved."""
        return {"stats": self.stats.state_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.stats.load_state_dict(state["stats"])
        self.generator.set_state(state["generator"])
