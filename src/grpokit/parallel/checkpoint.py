"""Resumable checkpoints: model, tokenizer, optimizer, scheduler, RNG states, step and data position.

Every process draws its own random numbers (sampling, the update's row order), so the RNG states are saved
one per process, in process order (``rng_state.pt`` holds the list), and each process restores its own.

Every file is read with an explicit ``map_location``: tensors saved from ``cuda:0`` would otherwise load
back onto ``cuda:0`` in every process. The optimizer state and the extra state go to the reading process's
own device, the rest to the CPU. A process that does not need a full state (FSDP's other processes, which
receive their shards from the main one) reads none: ``load_checkpoint(read_full_states=False)``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpokit.data.integrity import check_safetensors_file, corrupt, read_json_file

STATE_FILE = "trainer_state.json"
RNG_FILE = "rng_state.pt"
CONFIG_FILE = "config.yaml"
"""The GRPOConfig a checkpoint's run used (``hub_token`` left out), compared field by field on resume."""


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / f"checkpoint-{step}"


_CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """The ``checkpoint-<step>`` directories of ``output_dir`` holding a complete state, by step (one cut off
    mid-write is still ``checkpoint-<step>.tmp``, never listed)."""
    found = [
        p for p in Path(output_dir).glob("checkpoint-*")
        if _CHECKPOINT_NAME.match(p.name) and (p / STATE_FILE).exists()
    ]  # fmt: skip
    return sorted(found, key=lambda p: int(p.name.split("-")[-1]))


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The checkpoint-<step> directory with the highest step that holds a complete state, or None."""
    found = complete_checkpoints(output_dir)
    return found[-1] if found else None


@contextlib.contextmanager
def written_aside(folder: str | Path) -> Iterator[Path]:
    """A temporary directory inside ``folder`` to write into; when the block ends, its entries replace
    ``folder``'s of the same names (each one renamed: a reader never sees a half-written file), and it is
    removed. A block that raises leaves ``folder`` as it was (the temporary directory removed)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".model.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        for entry in sorted(tmp.iterdir()):
            target = folder / entry.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(entry, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def rng_state(generator: torch.Generator | None = None) -> dict[str, Any]:
    """This process's RNG states: python, numpy, torch (and CUDA), and ``generator``'s when given."""
    name, keys, position, has_gauss, cached = np.random.get_state()
    keys = torch.from_numpy(keys.astype(np.int64))
    numpy_state = [name, keys, int(position), int(has_gauss), float(cached)]
    # plain types and tensors only, so the file loads with torch.load(weights_only=True)
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if generator is not None:
        state["generator"] = generator.get_state()
    return state


def set_rng_state(state: dict[str, Any], generator: torch.Generator | None = None) -> None:
    random.setstate(_tuples(state["python"]))
    name, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if generator is not None and "generator" in state:
        generator.set_state(state["generator"])


def _tuples(value: Any) -> Any:
    """Python's RNG state as ``random.setstate`` wants it (lists back to tuples, at every level)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def device_name(device: torch.device | str) -> str:
    """``device`` as the loaders take it: "cpu" for any CPU device (accelerate's can be "cpu:0", which
    ``torch.load`` and safetensors do not know), else e.g. "cuda:3"."""
    device = torch.device(device)
    return "cpu" if device.type == "cpu" else str(device)


def load_checkpoint_file(file: Path, map_location: Any = "cpu", *, mmap: bool = False) -> Any:
    """A checkpoint file, its tensors on ``map_location`` (default the CPU: never the device it was saved
    from), with ``weights_only=True``: tensors and plain Python values only, never arbitrary pickled objects
    (a checkpoint from elsewhere cannot run code when it is resumed). ``mmap``: tensors are mapped from the
    file and read only when touched (CPU only). A file that holds such objects is refused as that; one that
    is cut off or damaged as "corrupt or truncated"."""
    if isinstance(map_location, (str, torch.device)):
        map_location = device_name(map_location)
    try:
        return torch.load(file, weights_only=True, map_location=map_location, mmap=mmap)
    except Exception as err:  # torch raises UnpicklingError with its own explanation
        if not _holds_objects(err):
            raise corrupt(file, "resume_from_checkpoint", _first_line(err)) from err
        raise ValueError(
            f"resume_from_checkpoint: {file} holds more than tensors and plain values, so it is not loaded "
            f"({type(err).__name__}: {_first_line(err)})"
        ) from err


def _holds_objects(err: Exception) -> bool:
    """Whether torch's weights-only loader refused a pickled object (a global it does not allow), rather than
    failing to read the file."""
    import pickle

    return isinstance(err, pickle.UnpicklingError) and "Unsupported global" in str(err)


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def process_rng_state(path: Path, process_index: int, num_processes: int) -> dict[str, Any]:
    """The RNG state process ``process_index`` saved in checkpoint ``path``."""
    states = load_checkpoint_file(path / RNG_FILE)
    if len(states) != num_processes:
        raise ValueError(
            f"resume_from_checkpoint: {path} was saved by {len(states)} process(es), this run has "
            f"{num_processes}; an exact resume needs the same number of processes"
        )
    return states[process_index]


def staging_dir(path: Path, *, create: bool = True) -> Path:
    """The temp dir a checkpoint is written to before it is renamed to ``path``; ``create`` empties it."""
    tmp = path.with_name(path.name + ".tmp")
    if create:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    return tmp


def save_checkpoint(
    path: Path,
    *,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    trainer_state: dict[str, Any],
    rng_states: list[dict[str, Any]],
    extra_tensors: dict[str, Any] | None = None,
    model_state: dict[str, Any] | None = None,
    optimizer_state: dict[str, Any] | None = None,
    staged: bool = False,
    config_text: str | None = None,
) -> Path:
    """Write everything a resume needs to ``path`` (written to a temp dir first, then renamed).
    ``model_state`` / ``optimizer_state``: full states gathered from shards (FSDP); default: the model's
    and the optimizer's own. ``staged``: the temp dir (``staging_dir``) already holds files that every
    process wrote (DeepSpeed's); it is completed, not emptied. ``config_text``: the run's config
    (``CONFIG_FILE``), which a resume compares with its own."""
    tmp = staging_dir(path, create=not staged)
    model.save_pretrained(tmp, state_dict=model_state)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    torch.save(
        optimizer_state if optimizer_state is not None else optimizer.state_dict(), tmp / "optimizer.pt"
    )
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    torch.save(rng_states, tmp / RNG_FILE)  # one per process, in process order
    torch.save(extra_tensors or {}, tmp / "extra_state.pt")
    if config_text is not None:
        (tmp / CONFIG_FILE).write_text(config_text)
    (tmp / STATE_FILE).write_text(json.dumps(trainer_state, indent=2))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path


def load_checkpoint(
    path: Path,
    *,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    generator: torch.Generator | None = None,
    process_index: int = 0,
    num_processes: int = 1,
    load_optimizer_state: Any = None,
    device: torch.device | str = "cpu",
    read_full_states: bool = True,
) -> tuple[dict, dict]:
    """Restore optimizer, scheduler and this process's RNG states (``generator``'s too); return
    (trainer_state, extra_tensors). ``load_optimizer_state``: how a full optimizer state is loaded (FSDP);
    default ``optimizer.load_state_dict``. ``device``: this process's device, where the optimizer state and
    the extra tensors are loaded. ``read_full_states=False``: the optimizer state is not read (an empty one
    is passed to ``load_optimizer_state``, which receives it from the main process) and the extra state's
    tensors are mapped, not read (the small values in it are used, the reference's weights are not).

    Model weights are loaded by the caller (``from_pretrained(path)`` or ``load_model_weights``).
    """
    if not (path / STATE_FILE).exists():
        raise FileNotFoundError(
            f"resume_from_checkpoint: {path} is not a grpokit checkpoint (no {STATE_FILE})"
        )
    optimizer_state = load_checkpoint_file(path / "optimizer.pt", device) if read_full_states else {}
    (load_optimizer_state or optimizer.load_state_dict)(optimizer_state)
    scheduler.load_state_dict(load_checkpoint_file(path / "scheduler.pt"))
    set_rng_state(process_rng_state(path, process_index, num_processes), generator)
    extra_file = path / "extra_state.pt"
    extra = (
        load_checkpoint_file(extra_file, device)
        if read_full_states
        else load_checkpoint_file(extra_file, "cpu", mmap=True)
    )
    return read_json_file(path / STATE_FILE, "resume_from_checkpoint"), extra


def read_model_weights(path: Path, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The weights ``save_pretrained`` wrote to ``path`` (all safetensors files, or a PEFT adapter's), on
    ``device``."""
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {path}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        check_safetensors_file(file, "resume_from_checkpoint")
        state.update(load_file(str(file), device=device_name(device)))
    return state


def in_model_names(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` as ``save_pretrained`` wrote it, under the model's own parameter names: transformers 5
    writes some architectures (LLaVA, Gemma 3, ...) under their original checkpoints' names
    (``language_model.model.*`` for ``model.language_model.*``); its renamings are applied back."""
    names = set(model.state_dict())
    if set(state) <= names:
        return state
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, rename_source_key

    renamings = [c for c in get_model_conversion_mapping(model) if isinstance(c, WeightRenaming)]
    return {rename_source_key(key, renamings, [])[0]: value for key, value in state.items()}


def load_model_weights(model: torch.nn.Module, path: Path, device: torch.device | str = "cpu") -> None:
    """Load the safetensors weights saved by ``save_pretrained`` into an existing model (strict), read
    onto ``device`` (the model's own, so no other device is touched).

    A PEFT model saved only its adapters: those are loaded into its adapters (the base weights are the
    ones it was built from, unchanged by training)."""
    if hasattr(model, "peft_config"):
        _load_adapter_weights(model, path, device)
        return
    state = in_model_names(model, read_model_weights(path, device))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {name for name in missing if "lm_head" in name}
    if set(missing) - tied or unexpected:
        raise RuntimeError(
            f"checkpoint {path} does not match the model: missing {missing}, unexpected {unexpected}"
        )


def _load_adapter_weights(model: torch.nn.Module, path: Path, device: torch.device | str) -> None:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    file = path / "adapter_model.safetensors"
    if not file.exists():
        raise FileNotFoundError(f"checkpoint {path} holds no adapter weights (adapter_model.safetensors)")
    check_safetensors_file(file, "resume_from_checkpoint")
    result = set_peft_model_state_dict(model, load_file(str(file), device=device_name(device)))
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    adapter_missing = [k for k in getattr(result, "missing_keys", []) or [] if "lora_" in k]
    if unexpected or adapter_missing:
        raise RuntimeError(
            f"checkpoint {path} does not match the adapters: "
            f"missing {adapter_missing}, unexpected {unexpected}"
        )


def prune_checkpoints(output_dir: str | Path, keep: int | None) -> None:
    """Delete all but the newest ``keep`` complete checkpoints (None: keep all)."""
    if keep is None:
        return
    done = complete_checkpoints(output_dir)
    for old in done[: max(0, len(done) - keep)]:
        shutil.rmtree(old, ignore_errors=True)
