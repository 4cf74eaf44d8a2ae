"""The benchmark's grpokit side (``benchmarks/side_grpokit.py``) on its smoke workload W0 with the tiny model:
it reports each timed step's phases, and the folder its trainer writes into (the final model: 517 MB for
SmolLM2) is gone when it ends, so repeated benchmark runs do not fill the disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_grpokit_side_reports_its_steps_and_leaves_no_folder_behind(tmp_path):
    model = tmp_path / "model"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tiny_model.py"), str(model)], check=True)
    temp = tmp_path / "tmp"  # the side's temporary folders go here (TMPDIR), not into the machine's /tmp
    temp.mkdir()
    out = tmp_path / "result.json"
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "side_grpokit.py"),
        "--model",
        str(model),
        "--workload",
        "W0",
        "--impl",
        "trainer",
        "--warmup",
        "1",
        "--steps",
        "1",
        "--out",
        str(out),
    ]
    subprocess.run(command, env={**os.environ, "TMPDIR": str(temp)}, check=True, timeout=600)

    result = json.loads(out.read_text())
    (step,) = result["steps"]
    phases = ("generate", "reward", "old_logps", "ref_logps", "policy_forward", "backward", "other")
    assert step["step"] > 0 and abs(sum(step[p] for p in phases) - step["step"]) < 1e-6
    assert step["generate"] > 0 and step["backward"] > 0 and step["ref_logps"] > 0  # W0: beta > 0
    assert [p.name for p in temp.iterdir() if p.name.startswith("bench-grpokit-")] == []
