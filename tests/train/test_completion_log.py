"""completion_records: one record per completion, None for NaN, sizes checked."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.reporting.completion_log import CompletionLog, completion_records


def test_records_match_the_inputs():
    rewards = torch.tensor([[1.0, math.nan], [0.0, 0.25]])
    records = completion_records(
        ["p", [{"role": "user", "content": "q"}]],
        ["a", "b"],
        ["acc", "fmt"],
        rewards,
        torch.tensor([1.0, 0.25]),
        torch.tensor([0.7071, -0.7071]),
    )
    assert records == [
        {
            "prompt": "p",
            "completion": "a",
            "rewards": {"acc": 1.0, "fmt": None},
            "reward": 1.0,
            "advantage": 0.7071,
        },
        {
            "prompt": [{"role": "user", "content": "q"}],
            "completion": "b",
            "rewards": {"acc": 0.0, "fmt": 0.25},
            "reward": 0.25,
            "advantage": -0.7071,
        },
    ]


def test_size_mismatch_is_refused():
    with pytest.raises(ValueError, match="sizes differ"):
        completion_records(["p"], ["a", "b"], ["acc"], torch.zeros(2, 1), torch.zeros(2), torch.zeros(2))


def make_log(tmp_path, write, num_to_print, enabled=True):
    return CompletionLog(
        tmp_path, write, num_to_print, reward_names=["acc"], is_logged=lambda step: True, enabled=enabled
    )


def test_disabled_log_writes_nothing(tmp_path):
    log = make_log(tmp_path, write=True, num_to_print=None, enabled=False)
    assert log.wanted  # every process still collects (the gather is collective) ...
    log.log(1, [{"prompt": "p", "completion": "a", "rewards": {}, "reward": 0.0, "advantage": 0.0}])
    assert not (tmp_path / "completions.jsonl").exists()  # ... but only the main process writes
    assert not make_log(tmp_path, write=False, num_to_print=0).wanted
