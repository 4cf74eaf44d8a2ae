"""The folder ``make_vllm_backend`` makes for the colocated engine (the policy's config.json, which vLLM's
real CPU engine is built from) is gone once the backend closes: a run per engine would otherwise leave one
in the machine's temporary folder. A module of its own: one engine at a time in a process."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpokit import GRPOConfig
from tests.vllm.helpers import COMPLETION_LEN, PROMPT_LEN, tiny_policy

pytest.importorskip("vllm", reason="vLLM is not installed: .ci/run's second stage runs tests/vllm")
pytestmark = pytest.mark.vllm

from grpokit.rollout.vllm_backend import make_vllm_backend  # noqa: E402


def test_closing_the_engine_removes_the_folder_made_for_it(tmp_path):
    model, _ = tiny_policy(seed=1, tie=True)
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"), use_vllm=True, generation_dtype="float32",
        max_prompt_length=PROMPT_LEN, max_completion_length=COMPLETION_LEN, seed=0,
    )  # fmt: skip
    backend = make_vllm_backend(args.vllm_settings(), model)
    folder = backend.owned_dir
    assert folder is not None and (Path(folder) / "config.json").is_file()
    backend.close()
    assert not Path(folder).exists()
