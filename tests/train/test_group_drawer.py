"""GroupDrawer without a trainer: the plain draw is a function, dynamic sampling a filter around its rounds.

Process 1 of two, seen from its side: round 1 draws rows 0, 1 (process 0) and 2, 3 (process 1), round 2
rows 4, 5 and 6, 7. G = 2. Rewards per group, written [r1, r2]:

    row   0      1      2      3      4      5      6      7
          [1,0]  [1,0]  [0,0]  [0,0]  [1,0]  [1,1]  [0,1]  [1,0]
          info   info   flat   flat   info   flat   info   info

Round 1 finds 2 informative groups of 4 (rate 1/2); 2 are missing, so round 2 draws
ceil(2 / (1/2)) = 4 prompts (2 per process). Now 2 + 3 = 5 >= 4: no round 3.
Process-major group order: p0 [0, 1, 4, 5], p1 [2, 3, 6, 7] -> positions 0..7; informative positions
0, 1, 2 (row 4), 6 (row 6), 7 (row 7); the first 4 are kept: positions [0, 1, 2, 6], 2 per process.
Process 1 trains on rows 4 (drawn by process 0, so gathered) and 6."""

from __future__ import annotations

import torch

from grpokit.reporting.metrics import PhaseTimer
from grpokit.rollout import GenerationOutput
from grpokit.rollout.records import Samples
from grpokit.sampling import GroupDrawer, GroupSizes, PromptStats, Round
from grpokit.sampling.groups import DrawSettings, _group_payloads

REWARDS = {0: [1, 0], 1: [1, 0], 2: [0, 0], 3: [0, 0], 4: [1, 0], 5: [1, 1], 6: [0, 1], 7: [1, 0]}
ROUNDS = [([0, 1], [2, 3]), ([4, 5], [6, 7])]  # per round: process 0's rows, process 1's rows


def samples_of(rows: list[int]) -> Samples:
    """Two completions per row: ids [row, j], text "row:j"."""
    generated = GenerationOutput([[k, j] for k in rows for j in range(2)], None, [False] * 2 * len(rows))
    return Samples(
        [{"prompt": f"{k}+0="} for k in rows for _ in range(2)],
        [[k] for k in rows],
        generated,
        [f"{k}:{j}" for k in rows for j in range(2)],
    )


def make_drawer(stats: PromptStats | None = None) -> tuple[GroupDrawer, list[int | None]]:
    counts: list[int | None] = []

    def draw_round(count, timer, backend=None) -> Round:
        counts.append(count)
        mine, theirs = ROUNDS[len(counts) - 1][1], ROUNDS[len(counts) - 1][0]
        every = theirs + mine  # process order: process 0 first
        rewards = torch.tensor([[float(r)] for k in every for r in REWARDS[k]])  # [P * n, 1]
        return Round(samples_of(mine), rewards, [2] * len(every), every, {"rewards/f/failures": 1.0})

    def gather(values):  # every process's list, process 0's first
        if isinstance(values[0], dict):  # group payloads: process 0 drew rows 0, 1, 4, 5
            return _group_payloads(samples_of([0, 1, 4, 5])) + values
        raise AssertionError("only the kept groups' samples are gathered")

    settings = DrawSettings(prompts=4, dynamic_sampling=True, max_rounds=4)
    drawer = GroupDrawer(draw_round, settings, torch.tensor([1.0]), rank=1, num_processes=2, gather=gather,
                         prompt_stats=stats)  # fmt: skip
    return drawer, counts


def test_rounds_are_joined_process_major_and_refilled_by_the_rate_seen():
    stats = PromptStats(8, pass_threshold=1.0)
    drawer, counts = make_drawer(stats)
    drawn = drawer.draw(PhaseTimer())
    assert counts == [None, 4]  # a step's prompts, then ceil(2 / 0.5) = 4
    assert drawn.rounds == 2
    assert drawn.prompt_indices == [0, 1, 4, 5, 2, 3, 6, 7]
    expected = [r for k in [0, 1, 4, 5, 2, 3, 6, 7] for r in REWARDS[k]]
    assert drawn.rewards[:, 0].tolist() == expected  # [M = 16, F = 1]
    assert [row["prompt"] for row in drawn.samples.rows[::2]] == ["2+0=", "3+0=", "6+0=", "7+0="]  # its own
    assert drawn.failures == {"rewards/f/failures": 2.0}  # summed over the rounds
    # pass rates (passes + 1) / (completions + 2): row 0 one of two -> 2/4, row 5 both -> 3/4, row 2 none
    assert [stats.pass_rate(k) for k in (0, 5, 2)] == [0.5, 0.75, 0.25]


def test_the_first_informative_groups_are_kept_and_spread_evenly():
    drawer, _ = make_drawer()
    drawn = drawer.draw(PhaseTimer())
    kept = drawer.kept_groups(drawn)
    assert kept.groups == [0, 1, 2, 6]  # rows 0, 1, 4, 6
    assert kept.rows.tolist() == [0, 1, 2, 3, 4, 5, 12, 13]
    assert kept.sizes == [2, 2, 2, 2] and kept.rewards[:, 0].tolist() == [1, 0, 1, 0, 1, 0, 0, 1]
    mine = drawer.local_groups(drawn, kept)
    assert [row["prompt"] for row in mine.rows] == ["4+0=", "4+0=", "6+0=", "6+0="]
    assert mine.generated.completion_ids == [[4, 0], [4, 1], [6, 0], [6, 1]]


def test_scores_and_metrics_of_the_kept_and_the_drawn():
    drawer, _ = make_drawer()
    drawn = drawer.draw(PhaseTimer())
    kept = drawer.kept_groups(drawn)
    advantages = torch.tensor([0.5, -0.5, 0.5, -0.5, 0.5, -0.5, -0.5, 0.5])  # [N = 8], any values
    trained, everything = drawer.scores(drawn, kept, advantages, step=1)
    assert trained.local == slice(4, 8)  # process 1: the second half of the kept rows
    assert trained.combined.tolist() == [1, 0, 1, 0, 1, 0, 0, 1]
    assert everything.local == slice(8, 16)  # what it drew: the second half of the M rows
    kept_rows = [0, 1, 2, 3, 4, 5, 12, 13]
    assert everything.kept.tolist() == [row in kept_rows for row in range(16)]
    assert everything.advantages[kept_rows].tolist() == advantages.tolist()
    assert everything.advantages[[6, 7, 8, 9, 10, 11, 14, 15]].tolist() == [0.0] * 8  # dropped: no signal
    assert drawer.metrics(drawn, kept, advantages) == {
        "signal/frac_completions_nonzero_advantage": 8 / 16,
        "signal/sampled_completions": 16.0,
        "dynamic_sampling/rounds": 2.0,
        "dynamic_sampling/kept_groups": 4.0,
        "dynamic_sampling/dropped_groups": 4.0,
    }


def test_without_dynamic_sampling_one_round_is_drawn_and_all_of_it_kept():
    rounds: list[int | None] = []

    def draw_round(count, timer, backend=None) -> Round:
        rounds.append(count)
        return Round(samples_of([2, 3]), torch.tensor([[1.0], [1.0], [0.0], [1.0]]), [2, 2], [2, 3], {})

    drawer = GroupDrawer(draw_round, DrawSettings(prompts=2), torch.tensor([1.0]))
    drawn = drawer.draw(PhaseTimer())
    kept = drawer.kept_groups(drawn)
    assert rounds == [None] and kept.groups == [0, 1]  # a flat group is kept too
    assert drawer.local_groups(drawn, kept) is drawn.samples
    trained, everything = drawer.scores(drawn, kept, torch.zeros(4), step=1)
    assert everything is trained and trained.kept is None and trained.local == slice(0, 4)


def test_group_sizes_without_pass_rates_are_num_generations():
    assert GroupSizes(num_generations=4)([7, 3, 9]) == [4, 4, 4]


def test_a_game_deal_is_informative_when_a_role_group_is():
    """A game's deal: 4 seats, two roles of 2, role-major. [1, 1, 0, 0]: each role's returns agree (no
    signal within a role), though the deal's four differ; [1, 1, 0, 1]: the second role's differ."""

    def draw_round(count, timer, backend=None) -> Round:
        rewards = torch.tensor([[1.0], [1.0], [0.0], [0.0], [1.0], [1.0], [0.0], [1.0]])
        return Round(samples_of([2, 3, 4, 5]), rewards, [4, 4], [2, 3], {})

    for roles, kept_groups in ((2, [1]), (1, [0, 1])):
        settings = DrawSettings(prompts=2, dynamic_sampling=True, max_rounds=1, roles=roles)
        drawer = GroupDrawer(draw_round, settings, torch.tensor([1.0]))
        assert drawer.kept_groups(drawer.draw(PhaseTimer())).groups == kept_groups
