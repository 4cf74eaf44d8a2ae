"""benchmarks/vision_learning.py runs end to end (cold start, greedy evaluations, GRPO on the tiny LLaVA) in
its --quick sizes and writes the JSON the full measurement keeps. A smoke test: the quick numbers mean
nothing."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "vision_learning.py"


@pytest.fixture(scope="module")
def script():
    """The benchmark script, imported from its path (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("vision_learning_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks the module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_the_quick_run_writes_every_field(script, tmp_path):
    out = tmp_path / "vision_learning.json"
    script.main(["--quick", "--seeds", "0", "--threads", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    for key in ("command", "date", "cpu", "torch_threads", "seeds", "mean_accuracy_before",
                "mean_accuracy_after"):  # fmt: skip
        assert key in result, key
    assert result["quick"] is True and result["torch_threads"] == 1
    assert "--quick" in result["command"]
    (seed,) = result["seeds"]
    assert seed["seed"] == 0
    for key in ("cold_start_steps", "accuracy_before", "accuracy_after", "grpo_steps", "seconds"):
        assert key in seed, key
    for key in ("accuracy_before", "accuracy_after", "mean_accuracy_before", "mean_accuracy_after"):
        value = seed.get(key, result.get(key))
        assert 0.0 <= value <= 1.0, (key, value)
    assert seed["cold_start_steps"] >= 1 and seed["grpo_steps"] == 2 and seed["seconds"] > 0


def test_the_task_is_deterministic_and_the_splits_differ(script):
    a, b = script.make_rows(0, "train", 4), script.make_rows(0, "train", 4)
    assert [r["answer"] for r in a] == [r["answer"] for r in b]
    assert [r["image"].tobytes() for r in a] == [r["image"].tobytes() for r in b]
    held_out = script.make_rows(0, "held_out", 4)
    assert [r["image"].tobytes() for r in a] != [r["image"].tobytes() for r in held_out]
    assert all(r["answer"] in script.COLOURS and r["image"].size == (32, 32) for r in a)
    rewards = script.exact_answer_reward(
        [[{"role": "assistant", "content": c}] for c in ("red", "red blue", "reddish", "", " blue")],
        ["red", "red", "red", "red", "blue"],
    )
    assert rewards == [1.0, 1.0, 0.0, 0.0, 1.0]
