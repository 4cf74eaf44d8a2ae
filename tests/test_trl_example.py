"""The seed's TRL example, as docs/migrating-from-trl.md prints it, runs on grpokit: the code block is read
from the doc and executed with the hub names replaced by local stand-ins (a tiny model directory and a
local JSON file; no hub here) and a one-step budget. It sets ``use_vllm=True``: where vLLM and a CUDA GPU
are, it trains through vLLM; elsewhere the trainer stops at construction with the error naming
``use_vllm=False``, and the example then runs with that one change."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from grpokit.rollout.vllm_common import VLLMUnavailableError

DOC = Path(__file__).resolve().parents[1] / "docs" / "migrating-from-trl.md"
HAS_VLLM_GPU = torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None


def ported_example() -> str:
    text = DOC.read_text()
    section = text.split("## The seed example, ported", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_seed_trl_example_runs_with_only_the_import_changed(tiny_model_dir, tmp_path):
    data = tmp_path / "deepmath.jsonl"
    rows = [  # DeepMath-103K's columns: a conversational prompt and a solution
        {"prompt": [{"role": "user", "content": f"{a}+{b}="}], "solution": str(a + b)}
        for a, b in [(1, 2), (3, 4), (2, 2), (5, 1)]
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    code = ported_example()
    assert "from grpokit import GRPOConfig, GRPOTrainer" in code and "use_vllm=True" in code
    replacements = {
        'load_dataset("trl-lib/DeepMath-103K", split="train")': (
            f'load_dataset("json", data_files={str(data)!r}, split="train")'
        ),
        '"Qwen/Qwen2.5-0.5B-Instruct"': repr(str(tiny_model_dir)),
        'output_dir="qwen2.5-0.5b-grpo",': (
            f"output_dir={str(tmp_path / 'run')!r}, max_steps=1, max_completion_length=6, disable_tqdm=True,"
        ),
    }
    for old, new in replacements.items():
        assert old in code
        code = code.replace(old, new)
    if not HAS_VLLM_GPU:  # use_vllm=True is accepted, and refused at construction with the alternative named
        with pytest.raises(VLLMUnavailableError, match=r"use_vllm=True .*Set use_vllm=False .*'fast'"):
            exec(compile(code, str(DOC), "exec"), {})
        code = code.replace("use_vllm=True,", "use_vllm=False,")
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.args.loss_type == "dapo" and trainer.args.beta == 0.0 and trainer.reference is None
    assert trainer.reward_names == ["accuracy_reward", "length_penalty"]
    assert trainer.step == 1 and (tmp_path / "run" / "config.json").exists()
