"""The CPU thread policy: torch's thread count follows the cores other processes leave idle, never above
what torch had at the start, and a requested count is kept."""

from __future__ import annotations

import pytest
import torch

from grpokit import GRPOConfig
from grpokit.parallel import threads
from grpokit.parallel.threads import ThreadPolicy, idle_cores_between


@pytest.fixture
def four_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)


def test_idle_cores_by_hand():
    """4 cores, 100 ticks/s, 2 s of wall time = 800 total jiffies. All processes were busy 500 jiffies
    (5 s of CPU), this one 1.5 s: the others used 3.5 s / 2 s = 1.75 cores, leaving 2.25 idle."""
    assert idle_cores_between((0, 0, 0.0), (500, 800, 1.5), cores=4, clock_ticks=100) == pytest.approx(2.25)
    assert idle_cores_between((0, 0, 0.0), (800, 800, 0.0), cores=4, clock_ticks=100) == 0.0  # all busy
    assert idle_cores_between((0, 0, 0.0), (0, 0, 0.0), cores=4, clock_ticks=100) == 4.0  # no time passed


def test_the_count_follows_the_idle_cores_within_the_starting_ceiling(four_threads, monkeypatch):
    """Readings of a 4-core machine (100 ticks/s), 1 s apart: others busy on 3 cores, then on none."""
    readings = iter([
        (0, 0, 0.0),  # construction
        (0, 400, 0.0),  # after the first look: idle machine -> 4 threads (the ceiling)
        (300, 800, 0.0),  # a step while others used 3 cores -> 1 thread
        (300 + 50, 1200, 0.5),  # a step where only this process worked -> back to 4
    ])  # fmt: skip
    monkeypatch.setattr(threads, "_reading", lambda: next(readings))
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    monkeypatch.setattr(threads.os, "sysconf", lambda name: 100)
    policy = ThreadPolicy(None, local_processes=1)
    assert torch.get_num_threads() == 4
    policy.after_step()
    assert torch.get_num_threads() == 1
    policy.after_step()
    assert torch.get_num_threads() == 4


def test_processes_of_one_machine_share_the_idle_cores(four_threads, monkeypatch):
    readings = iter([(0, 0, 0.0), (0, 400, 0.0)])
    monkeypatch.setattr(threads, "_reading", lambda: next(readings))
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    monkeypatch.setattr(threads.os, "sysconf", lambda name: 100)
    ThreadPolicy(None, local_processes=2)
    assert torch.get_num_threads() == 2


def test_a_requested_count_is_kept_and_zero_leaves_torch_alone(four_threads):
    policy = ThreadPolicy(3)
    assert torch.get_num_threads() == 3 and not policy.adaptive
    policy.after_step()
    assert torch.get_num_threads() == 3
    torch.set_num_threads(4)
    assert not ThreadPolicy(0).adaptive and torch.get_num_threads() == 4
    assert ThreadPolicy.for_run(GRPOConfig(torch_num_threads=2), cpu=False) is None  # GPUs: not these threads


def test_a_negative_count_is_refused():
    with pytest.raises(ValueError, match="torch_num_threads must be >= 0"):
        GRPOConfig(torch_num_threads=-1)
