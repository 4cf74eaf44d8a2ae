"""Run by tests/train/test_interrupt_anywhere.py in a subprocess: ``grpokit train`` (its ``main``, in this
process) on a local tiny policy, once uninterrupted, then ``trials`` times with a SIGTERM sent to this
process at a random moment of the run (loading, the evaluation before training, a step, a checkpoint
write, the final save, the evaluation after). After each stop the folder must hold a finished run, or a
checkpoint that ``resume_from_checkpoint=latest`` continues, or nothing trained (the same command starts
again); the run is then completed that way and its final weights compared with the uninterrupted run's.
Prints one JSON object: the uninterrupted run's duration and, per trial, the delay, what the folder held
and whether the final weights were equal."""

from __future__ import annotations

import io
import json
import os
import random
import signal
import sys
import threading
import time
from contextlib import redirect_stdout
from pathlib import Path

import torch
from safetensors.torch import load_file

from grpokit.cli import main
from grpokit.data.run_folder import read_manifest
from grpokit.parallel.checkpoint import latest_checkpoint


def argv(model: str, out: Path) -> list[str]:
    return [
        "train", f"model={model}", "task=arithmetic", "num_train_examples=32", "num_eval_examples=8",
        "eval_max_new_tokens=6", f"output_dir={out}", "max_steps=3", "save_steps=1", "num_generations=4",
        "per_device_train_batch_size=8", "max_completion_length=6", "disable_tqdm=true", "learning_rate=1e-2",
        "logging_steps=1",
    ]  # fmt: skip


def run(arguments: list[str]) -> str:
    """``grpokit train`` here; its printed lines (the closing line among them)."""
    text = io.StringIO()
    with redirect_stdout(text):
        try:
            main(arguments)
        except SystemExit as exit_:  # a refusal: one line
            print(f"exit: {exit_}")
        except KeyboardInterrupt as stop:  # a signal during the claim's own bookkeeping
            print(f"interrupted: {stop}")
    return text.getvalue()


def weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "model.safetensors"))


def complete(model: str, out: Path) -> tuple[str, str]:
    """What the stopped run left (finished / checkpoint / nothing), after completing it that way."""
    manifest = read_manifest(out) or {}
    if manifest.get("training") == "finished":
        return "finished", ""
    if latest_checkpoint(out) is not None:
        return "checkpoint", run([*argv(model, out), "resume_from_checkpoint=latest"])
    return "nothing", run(argv(model, out))


def main_(model: str, root: Path, trials: int, seed: int) -> None:
    torch.set_num_threads(1)
    signal.signal(signal.SIGTERM, lambda *_: None)  # a timer that fires between runs does nothing
    run(argv(model, root / "warm-up"))  # the first run pays for imports and first calls
    started = time.perf_counter()
    reference_out = root / "uninterrupted"
    run(argv(model, reference_out))
    duration = time.perf_counter() - started
    reference = weights(reference_out)
    rng = random.Random(seed)
    results = []
    for trial in range(trials):
        out = root / f"trial-{trial}"
        delay = rng.uniform(0.0, duration)
        timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        printed = run(argv(model, out))
        timer.cancel()
        left, completed = complete(model, out)
        final = read_manifest(out) or {}
        same = (out / "model.safetensors").exists() and all(
            torch.equal(value, reference[name]) for name, value in weights(out).items()
        )
        results.append({
            "delay": round(delay, 3), "left": left, "same_weights": same, "state": final.get("state"),
            "stage": final.get("stage"), "closing": printed.strip().splitlines()[-1:],
            "completion": completed.strip().splitlines()[-1:],
        })  # fmt: skip
    print(json.dumps({"duration": duration, "trials": results}))


if __name__ == "__main__":
    main_(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
