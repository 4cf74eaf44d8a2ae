"""Per-prompt statistics, the difficulty curriculum and the sampler that consults it: hand-counted examples,
exploration, the termination guard, determinism across processes and exact resumes."""

import io
import json
from types import SimpleNamespace

import pytest
import torch

from grpokit.config import GRPOConfig
from grpokit.sampling.prompt_stats import Curriculum, PromptStats
from grpokit.train.prompts import PromptSampler

NAN = float("nan")


def stats_with(num_rows: int, counts: dict[int, tuple[int, int]], threshold: float = 1.0) -> PromptStats:
    """Statistics where row i has seen/passed = counts[i] (one group per row)."""
    stats = PromptStats(num_rows, threshold)
    indices = list(counts)
    sizes = [counts[i][0] for i in indices]
    rewards = [float(k < counts[i][1]) for i in indices for k in range(counts[i][0])]
    stats.update(indices, torch.tensor(rewards), sizes)
    return stats


def curriculum(stats: PromptStats, explore: float = 0.0, seed: int = 0, **fields) -> Curriculum:
    settings = {"min_pass_rate": 0.05, "max_pass_rate": 0.95, "min_samples": 8} | fields
    return Curriculum(stats, explore=explore, seed=seed, **settings)


def torch_round_trip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


# --- PromptStats ---------------------------------------------------------------------------------------


def test_stats_by_hand():
    stats = PromptStats(5, pass_threshold=1.0)
    # group 0 -> row 3: [1, 0, 1, NaN]; group 1 -> row 1: [0, 0]; group 2 -> row 3 again: [1.5, 0.2]
    rewards = torch.tensor([1.0, 0.0, 1.0, NAN, 0.0, 0.0, 1.5, 0.2])
    stats.update([3, 1, 3], rewards, [4, 2, 2])
    # row 3: counted 3 + 2 = 5 (the NaN is not counted), passed 2 + 1 = 3 (1.0 >= 1.0 passes)
    assert (stats.seen(3), stats.passed(3)) == (5, 3)
    assert stats.pass_rate(3) == pytest.approx((3 + 1) / (5 + 2))  # 4/7
    assert (stats.seen(1), stats.passed(1)) == (2, 0)
    assert stats.pass_rate(1) == pytest.approx(1 / 4)  # (0 + 1) / (2 + 2)
    assert stats.pass_rate(0) is None and stats.seen(0) == 0
    assert stats.tracked == 2
    assert stats.pass_rates([3, 0, 1]) == [pytest.approx(4 / 7), None, pytest.approx(0.25)]


def test_a_group_of_nan_rewards_leaves_the_row_untracked():
    stats = PromptStats(3, pass_threshold=0.5)
    stats.update([2], torch.tensor([NAN, NAN]), [2])
    assert stats.pass_rate(2) is None and stats.tracked == 0


def test_stats_accept_rewards_on_any_device_and_dtype():
    stats = PromptStats(2, pass_threshold=0.5)
    stats.update([0, 1], torch.tensor([0.5, 0.4, 0.9], dtype=torch.bfloat16), [1, 2])
    assert (stats.seen(0), stats.passed(0), stats.seen(1), stats.passed(1)) == (1, 1, 2, 1)


def test_stats_refuse_inconsistent_updates():
    stats = PromptStats(4, pass_threshold=1.0)
    with pytest.raises(ValueError, match="one entry per group"):
        stats.update([0, 1], torch.zeros(4), [4])
    with pytest.raises(ValueError, match=r"sum\(group_sizes\) = 4"):
        stats.update([0], torch.zeros(3), [4])
    with pytest.raises(ValueError, match="row index 4 is out of range for 4"):
        stats.update([4], torch.zeros(2), [2])
    assert stats.tracked == 0  # nothing counted by a refused update


def test_stats_state_round_trips_as_json_and_weights_only():
    stats = stats_with(6, {0: (8, 8), 4: (3, 1)}, threshold=0.5)
    state = stats.state_dict()
    for restored_state in (json.loads(json.dumps(state)), torch_round_trip(state)):
        restored = PromptStats(6, pass_threshold=1.0)
        restored.load_state_dict(restored_state)
        assert restored.pass_threshold == 0.5
        assert [restored.pass_rate(i) for i in range(6)] == [stats.pass_rate(i) for i in range(6)]
    with pytest.raises(ValueError, match="saved for 6 training rows, this run has 7"):
        PromptStats(7, 1.0).load_state_dict(state)


# --- Curriculum ----------------------------------------------------------------------------------------


def test_curriculum_skips_settled_prompts_and_keeps_uncertain_ones():
    # 24 completions: all passed -> 25/26 = 0.96 > 0.95 (easy); none -> 1/26 = 0.038 < 0.05 (hard);
    # half -> 13/26 = 0.5 (kept); row 3 always passed but only 4 completions (< min_samples 8) -> kept;
    # row 4: 8 of 8 passed -> 9/10 = 0.9, not above 0.95 (the prior keeps a short record in play);
    # row 5 unseen
    stats = stats_with(6, {0: (24, 24), 1: (24, 0), 2: (24, 12), 3: (4, 4), 4: (8, 8)})
    cur = curriculum(stats)
    assert [cur.verdict(i) for i in range(6)] == ["easy", "hard", None, None, None, None]
    assert [cur.accepts(i) for i in range(6)] == [False, False, True, True, True, True]
    assert cur.metrics() == {
        "curriculum/skipped_easy": 1.0,
        "curriculum/skipped_hard": 1.0,
        "curriculum/explored": 0.0,
        "curriculum/forced": 0.0,
        "curriculum/tracked_prompts": 5.0,
    }
    # the counters are reset by reading them
    assert cur.metrics()["curriculum/skipped_easy"] == 0.0


def test_exploration_brings_skipped_prompts_back_at_its_rate():
    stats = stats_with(2, {0: (24, 24), 1: (24, 0)})
    cur = curriculum(stats, explore=0.1, seed=123)
    draws = 10_000
    taken = sum(cur.accepts(i % 2) for i in range(draws))
    assert 0.09 <= taken / draws <= 0.11
    metrics = cur.metrics()
    assert metrics["curriculum/explored"] == taken
    assert metrics["curriculum/skipped_easy"] + metrics["curriculum/skipped_hard"] == draws - taken


def test_same_seed_and_stats_decide_identically_on_every_process():
    counts = {0: (24, 24), 1: (24, 0), 2: (24, 12), 3: (30, 30)}
    a = curriculum(stats_with(5, counts), explore=0.3, seed=7)
    b = curriculum(stats_with(5, counts), explore=0.3, seed=7)
    order = [i % 5 for i in range(500)]
    decisions = [a.accepts(i) for i in order]
    assert decisions == [b.accepts(i) for i in order]
    assert a.metrics() == b.metrics()
    other = curriculum(stats_with(5, counts), explore=0.3, seed=8)
    assert [other.accepts(i) for i in order] != decisions


def test_from_config_reads_the_curriculum_fields():
    args = GRPOConfig(
        seed=3,
        curriculum=True,
        curriculum_pass_threshold=0.5,
        curriculum_min_pass_rate=0.2,
        curriculum_max_pass_rate=0.7,
        curriculum_min_samples=4,
        curriculum_explore=0.25,
    )
    cur = Curriculum.from_config(args, num_rows=10)
    assert (cur.stats.num_rows, cur.stats.pass_threshold) == (10, 0.5)
    assert (cur.min_pass_rate, cur.max_pass_rate, cur.min_samples, cur.explore) == (0.2, 0.7, 4, 0.25)
    assert torch.equal(cur.generator.get_state(), torch.Generator().manual_seed(3).get_state())
    shared = PromptStats(10, 0.5)
    assert Curriculum.from_config(args, 10, stats=shared).stats is shared
    with pytest.raises(ValueError, match="stats cover 10 rows"):
        Curriculum.from_config(args, 11, stats=shared)


def test_curriculum_state_holds_the_stats_and_the_generator():
    counts = {0: (24, 24), 1: (24, 0), 2: (24, 12)}
    cur = curriculum(stats_with(3, counts), explore=0.5, seed=1)
    for i in range(7):
        cur.accepts(i % 3)
    state = torch_round_trip(cur.state_dict())
    restored = curriculum(PromptStats(3, 1.0), explore=0.5, seed=99)
    restored.load_state_dict(state)
    assert [restored.accepts(i % 3) for i in range(50)] == [cur.accepts(i % 3) for i in range(50)]


# --- PromptSampler with a curriculum ----------------------------------------------------------------------


def args(**fields) -> GRPOConfig:
    return GRPOConfig(seed=0, **fields)


def test_the_sampler_without_a_curriculum_is_unchanged():
    sampler = PromptSampler(5, 3, args(shuffle_dataset=False))
    assert [sampler.next_indices() for _ in range(3)] == [[0, 1, 2], [3, 4, 0], [1, 2, 3]]
    assert sampler.state_dict() == {"epoch": 1, "position": 4, "rejections": 0}


def test_an_accepting_curriculum_keeps_the_epoch_order():
    plain = PromptSampler(7, 3, args())
    with_curriculum = PromptSampler(7, 3, args(), curriculum(PromptStats(7, 1.0)))
    assert [plain.next_indices() for _ in range(6)] == [with_curriculum.next_indices() for _ in range(6)]
    assert plain.state_dict() == with_curriculum.state_dict()


def test_the_sampler_walks_past_skipped_prompts():
    # rows 1 and 3 always solved (skipped), no exploration; order 0..5 without shuffling
    cur = curriculum(stats_with(6, {1: (24, 24), 3: (24, 24)}))
    sampler = PromptSampler(6, 2, args(shuffle_dataset=False), cur)
    assert [sampler.next_indices() for _ in range(3)] == [[0, 2], [4, 5], [0, 2]]
    assert sampler.state_dict() == {"epoch": 1, "position": 3, "rejections": 0}
    assert cur.metrics()["curriculum/skipped_easy"] == 3.0  # 1, 3, then 1 again


def test_a_full_pass_of_rejections_forces_the_next_candidate():
    # every row settled, no exploration: 4 rejections (a full pass), then the next candidate is taken
    cur = curriculum(stats_with(4, dict.fromkeys(range(4), (24, 24))))
    sampler = PromptSampler(4, 2, args(shuffle_dataset=False), cur)
    # 0 1 2 3 refused | epoch 1: 0 forced, 1 2 3 refused | epoch 2: 0 refused (4 in a row), 1 forced
    assert sampler.next_indices() == [0, 1]
    assert sampler.state_dict() == {"epoch": 2, "position": 2, "rejections": 0}
    metrics = cur.metrics()
    assert (metrics["curriculum/forced"], metrics["curriculum/skipped_easy"]) == (2.0, 8.0)
    # the rejection count carries over steps: 2 3 refused, epoch 3: 0 1 refused, 2 forced, ...
    assert sampler.next_indices() == [2, 3]


def test_rejections_carry_over_between_steps():
    # row 0 uncertain, rows 1..3 settled: rejections reset whenever row 0 is taken
    cur = curriculum(stats_with(4, {1: (24, 0), 2: (24, 0), 3: (24, 0)}))
    sampler = PromptSampler(4, 1, args(shuffle_dataset=False), cur)
    assert [sampler.next_indices() for _ in range(3)] == [[0], [0], [0]]
    assert cur.metrics()["curriculum/forced"] == 0.0
    assert sampler.state_dict()["rejections"] == 0


def test_local_indices_are_contiguous_shares_of_the_global_step():
    rows = [{"prompt": str(i)} for i in range(8)]
    samplers = [PromptSampler(8, 4, args()) for _ in range(2)]
    shares = [
        sampler.next_local_indices(SimpleNamespace(num_processes=2, process_index=k))
        for k, sampler in enumerate(samplers)
    ]
    assert shares[0] + shares[1] == samplers[0].last_indices == samplers[1].last_indices
    assert len(shares[0]) == 2
    sampler = PromptSampler(8, 4, args())
    local = sampler.next_local_rows(rows, SimpleNamespace(num_processes=2, process_index=1))
    assert local == [rows[i] for i in shares[1]]


def test_the_curriculum_must_cover_the_sampled_rows():
    with pytest.raises(ValueError, match="tracks 3 rows, the sampler draws from 4"):
        PromptSampler(4, 2, args(), curriculum(PromptStats(3, 1.0)))


def test_a_sampler_state_from_before_the_curriculum_loads():
    sampler = PromptSampler(5, 2, args())
    sampler.load_state_dict({"epoch": 2, "position": 3})
    assert sampler.state_dict() == {"epoch": 2, "position": 3, "rejections": 0}


# --- exact resume ------------------------------------------------------------------------------------------

ROWS, PROMPTS, GROUP = 12, 4, 8


def rewards_for(step: int, indices: list[int]) -> torch.Tensor:
    """Rows 0-3 always solved, 4-7 never, 8-11 at random (fixed by step and row)."""
    rewards = []
    for row in indices:
        if row < 4:
            rewards += [1.0] * GROUP
        elif row < 8:
            rewards += [0.0] * GROUP
        else:
            generator = torch.Generator().manual_seed(1000 * step + row)
            rewards += torch.randint(0, 2, (GROUP,), generator=generator).float().tolist()
    return torch.tensor(rewards)


def run_steps(sampler: PromptSampler, cur: Curriculum, first: int, count: int):
    """``count`` training steps from step ``first``: pick the prompts, then count their rewards."""
    picked, metrics = [], []
    for step in range(first, first + count):
        indices = sampler.next_indices()
        cur.stats.update(indices, rewards_for(step, indices), [GROUP] * len(indices))
        picked.append(indices)
        metrics.append(cur.metrics())
    return picked, metrics


def new_run() -> tuple[PromptSampler, Curriculum]:
    config = args(curriculum=True, curriculum_explore=0.3, curriculum_min_samples=8)
    cur = Curriculum.from_config(config, ROWS)
    return PromptSampler(ROWS, PROMPTS, config, cur), cur


def test_resume_continues_exactly():
    sampler, cur = new_run()
    run_steps(sampler, cur, first=1, count=10)
    # what a checkpoint keeps: the sampler in trainer_state.json, the curriculum in extra_state.pt
    sampler_state = json.loads(json.dumps(sampler.state_dict()))
    curriculum_state = torch_round_trip(cur.state_dict())
    continued, continued_metrics = run_steps(sampler, cur, first=11, count=12)

    resumed_sampler, resumed_cur = new_run()
    resumed_sampler.load_state_dict(sampler_state)
    resumed_cur.load_state_dict(curriculum_state)
    resumed, resumed_metrics = run_steps(resumed_sampler, resumed_cur, first=11, count=12)

    assert resumed == continued
    assert resumed_metrics == continued_metrics
    assert resumed_sampler.state_dict() == sampler.state_dict()
    # the continuation did exercise the curriculum: settled rows were skipped and some explored
    assert sum(m["curriculum/skipped_easy"] + m["curriculum/skipped_hard"] for m in continued_metrics) > 0
    assert sum(m["curriculum/explored"] for m in continued_metrics) > 0
