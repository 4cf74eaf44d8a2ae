"""Each package says what it offers: an ``__all__`` whose every name imports. And the contract of DESIGN's
public API: ``from grpokit import GRPOConfig, GRPOTrainer`` and ``grpokit.core.policy_loss``."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import grpokit


def packages() -> list[str]:
    found = ["grpokit"]
    for info in pkgutil.walk_packages(grpokit.__path__, prefix="grpokit."):
        if info.ispkg:
            found.append(info.name)
    return sorted(found)


def test_the_rooms_are_found():
    names = set(packages())
    for room in ("core", "data", "tasks", "rollout", "rewards", "rewards.isolation",
                 "rewards.process_rewards", "rm", "train", "eval", "models", "cli"):  # fmt: skip
        assert f"grpokit.{room}" in names, room


@pytest.mark.parametrize("name", packages())
def test_every_package_declares_public_names_that_import(name):
    module = importlib.import_module(name)
    public = getattr(module, "__all__", None)
    assert public, f"{name} has no __all__"
    assert len(set(public)) == len(public), f"{name}.__all__ repeats a name"
    for item in public:
        assert getattr(module, item) is not None, f"{name}.{item}"


def test_the_public_api_contract():
    from grpokit import GRPOConfig, GRPOTrainer
    from grpokit.core import group_advantages, kl_penalty, policy_loss, process_advantages

    assert callable(GRPOTrainer) and callable(GRPOConfig)
    assert all(callable(f) for f in (group_advantages, kl_penalty, policy_loss, process_advantages))


def test_import_grpokit_stays_light():
    """``import grpokit`` (the CLI's first step) loads neither torch nor transformers; GRPOTrainer does."""
    import subprocess
    import sys

    code = "import sys, grpokit; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("module", ["grpokit", "grpokit.cli"])
def test_python_dash_m_runs_the_command_line(module):
    """``python -m grpokit train`` (what the accelerate configs' comments and docs/scaling.md launch) and
    ``python -m grpokit.cli train`` both reach the command line."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", module, "train", "--help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "output_dir" in out.stdout
