"""Checkpoint files load with ``torch.load(weights_only=True)``: a resume restores tensors and plain values
only, and a file holding a pickled object (which could run code while unpickled) is refused with a message
naming the file, before anything from it runs."""

from __future__ import annotations

import pytest
import torch

from grpokit import GRPOTrainer
from grpokit.parallel import checkpoint

from ..conftest import small_config
from .conftest import digit_reward

RAN: list[str] = []


def record(what: str) -> None:
    RAN.append(what)


class Hostile:
    """Unpickling calls ``record("code ran")``: what a malicious checkpoint would do."""

    def __reduce__(self):
        return (record, ("code ran",))


def trainer(tiny_model_dir, rows, tmp_path) -> GRPOTrainer:
    config = small_config(tmp_path, save_steps=1)
    return GRPOTrainer(str(tiny_model_dir), [digit_reward], config, train_dataset=rows)


def test_every_checkpoint_file_loads_with_weights_only(tiny_model_dir, rows, tmp_path):
    trainer(tiny_model_dir, rows, tmp_path).train()
    path = tmp_path / "run" / "checkpoint-1"
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pt", "extra_state.pt"):
        torch.load(path / name, weights_only=True)  # raises if anything but tensors and plain values
    resumed = trainer(tiny_model_dir, rows, tmp_path)
    assert resumed.run_state.resume(str(path), tmp_path / "run") == 1


@pytest.mark.parametrize("name", ["optimizer.pt", "extra_state.pt", "rng_state.pt"])
def test_a_checkpoint_holding_a_pickled_object_is_refused(tiny_model_dir, rows, tmp_path, name):
    trainer(tiny_model_dir, rows, tmp_path).train()
    path = tmp_path / "run" / "checkpoint-1"
    torch.save({"state": Hostile()}, path / name)
    RAN.clear()
    resumed = trainer(tiny_model_dir, rows, tmp_path)
    with pytest.raises(ValueError, match=f"{name} holds more than tensors and plain values"):
        resumed.run_state.resume(str(path), tmp_path / "run")
    assert RAN == []  # nothing from the file ran
    torch.load(path / name, weights_only=False)  # (the file does run code when loaded the unsafe way)
    assert RAN == ["code ran"]
    assert checkpoint.latest_checkpoint(tmp_path / "run") == path
