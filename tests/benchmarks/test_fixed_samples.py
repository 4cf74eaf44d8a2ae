"""The benchmark's fixed samples (``--fixed-samples``): completions recorded once
(benchmarks/fixed_samples.py) and replayed on every side, so that the step ratio compares the same work.
The grpokit side must train on exactly the recorded completions of each step; the replay hands each group
of a prompt the next group recorded for it, and refuses a prompt it has no completions for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import FixedSamples, completions_digest  # noqa: E402


def _write(path: Path, rows: list[dict], num_generations: int) -> str:
    recorded = {"workload": "test", "seed": 0, "num_generations": num_generations, "rows": rows}
    path.write_text(json.dumps(recorded))
    return str(path)


def test_each_group_of_a_prompt_gets_the_next_recorded_group(tmp_path):
    rows = [
        {"prompt_ids": [1, 2], "completion_ids": [[10], [11]]},
        {"prompt_ids": [3], "completion_ids": [[30, 31], [32]]},
        {"prompt_ids": [1, 2], "completion_ids": [[12], [13]]},  # the same prompt in a later row
    ]
    samples = FixedSamples(_write(tmp_path / "s.json", rows, num_generations=2))

    assert samples.completions([[1, 2], [1, 2], [3], [3]]) == [[10], [11], [30, 31], [32]]
    assert samples.completions([(1, 2), (1, 2)]) == [[12], [13]]  # any sequence of ints names a prompt
    with pytest.raises(KeyError, match=r"no recorded group left for row 0's prompt \(2 tokens; 2 recorded\)"):
        samples.completions([[1, 2], [1, 2]])


def test_a_prompt_never_recorded_is_refused_naming_the_file_and_row(tmp_path):
    path = _write(tmp_path / "s.json", [{"prompt_ids": [1], "completion_ids": [[5], [6]]}], num_generations=2)
    with pytest.raises(KeyError, match=r"s\.json: no recorded group left for row 2's prompt \(3 tokens; 0"):
        FixedSamples(path).completions([[1], [1], [7, 8, 9], [7, 8, 9]])


def test_grpokit_side_trains_on_the_recorded_completions_of_each_step(tmp_path):
    model = tmp_path / "model"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tiny_model.py"), str(model)], check=True)
    samples = tmp_path / "samples.json"
    common = ["--model", str(model), "--workload", "W0", "--warmup", "1", "--steps", "1"]
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "fixed_samples.py"), *common, "--out", str(samples)],
        check=True,
        timeout=300,
    )
    out = tmp_path / "result.json"
    side = [sys.executable, str(ROOT / "benchmarks" / "side_grpokit.py"), *common, "--impl", "trainer"]
    subprocess.run([*side, "--fixed-samples", str(samples), "--out", str(out)], check=True, timeout=600)

    recorded = json.loads(samples.read_text())
    assert recorded["num_generations"] == 4 and len(recorded["rows"]) == 4  # W0: 2 prompts x 4, 2 steps
    # The timed step (the second) reads the dataset's rows 2 and 3 in order: their recorded completions.
    timed = [ids for row in recorded["rows"][2:4] for ids in row["completion_ids"]]
    (step,) = json.loads(out.read_text())["lengths"]
    assert step["digest"] == completions_digest(timed)
    assert step["completions"] == [len(ids) for ids in timed] == [8] * 8  # W0: no EOS, 8 new tokens
