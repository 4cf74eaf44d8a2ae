"""Resuming a run, checked before anything runs: the checkpoint must exist and be whole, and the new run
must be the same run. Each refusal is one sentence naming the field (or file), both values and what to do:

* ``resume_from_checkpoint`` naming no checkpoint (a missing path, a directory without ``trainer_state.json``,
  ``latest`` in an output_dir without checkpoints);
* a file of the checkpoint cut off or damaged (``grpokit.data.integrity``: "corrupt or truncated");
* another number of processes (each restores its own random state);
* a config change the checkpoint's state cannot follow (``parallel.resume_fields``: batch sizes, data order,
  placement...), other training rows, another model shape or other LoRA adapters;
* a checkpoint already at or past ``max_steps`` (nothing left to train).

Honoured changes are logged, one line each, and the optimizer's hyperparameters and the learning-rate
schedule's base rates are the new config's after the checkpoint's state is restored
(:class:`OptimizerSettings`): the checkpoint keeps only what was learned (AdamW's moments, the step).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from grpokit.data.integrity import (
    InputError,
    check_safetensors_file,
    check_torch_file,
    corrupt,
    read_json_file,
)
from grpokit.parallel.checkpoint import (
    CONFIG_FILE,
    RNG_FILE,
    STATE_FILE,
    latest_checkpoint,
    load_checkpoint_file,
)
from grpokit.parallel.resume_fields import rule_for

__all__ = [
    "CONFIG_FILE",
    "OptimizerSettings",
    "ResumeError",
    "ResumePlan",
    "check_checkpoint_files",
    "config_changes",
    "config_record",
    "plan_resume",
    "resolve_checkpoint",
    "run_identity",
]

logger = logging.getLogger(__name__)

WHAT = "resume_from_checkpoint"
END_OF_RECORD = "# end of the GRPOConfig record"
STATE_FILES = (STATE_FILE, "optimizer.pt", "scheduler.pt", RNG_FILE, "extra_state.pt")
HOLDS = (
    "a checkpoint-<step> directory holds trainer_state.json, optimizer.pt, scheduler.pt, rng_state.pt, "
    "extra_state.pt and the model's *.safetensors (written every save_steps)"
)
ARCHITECTURE = (
    "model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "intermediate_size",
)  # fmt: skip
ADAPTER = ("r", "lora_alpha", "target_modules")


class ResumeError(InputError):
    """A resume refused before anything runs."""


# -- which checkpoint --
def resolve_checkpoint(resume: str | bool | Path, output_dir: str | Path) -> Path:
    """The checkpoint directory ``resume`` names (True / "latest": the newest complete one in
    ``output_dir``); a path that is not one is a :class:`ResumeError` saying what a checkpoint holds."""
    if resume is True or resume == "latest":
        found = latest_checkpoint(output_dir)
        if found is None:
            raise ResumeError(
                f"{WHAT}={resume}: {output_dir} holds no complete checkpoint-<step> directory to resume; "
                f"{HOLDS}. Start without resume_from_checkpoint, or give the output_dir of the run to resume"
            )
        return found
    path = Path(str(resume)).expanduser()
    if not path.exists():
        raise ResumeError(f"{WHAT}={resume}: {path} does not exist; {HOLDS}, or give latest")
    if not path.is_dir():
        raise ResumeError(f"{WHAT}={resume}: {path} is a file, not a checkpoint directory; {HOLDS}")
    if not (path / STATE_FILE).exists():
        inside = latest_checkpoint(path)
        hint = f" (it holds {inside.name}: resume that, or give latest)" if inside is not None else ""
        raise ResumeError(
            f"{WHAT}={resume}: {path} is not a checkpoint, it has no {STATE_FILE}{hint}; {HOLDS}"
        )
    return path


# -- its files --
def check_checkpoint_files(path: Path, num_processes: int | None = None) -> dict[str, Any]:
    """Every file a resume reads, present and whole (cheap checks: see ``grpokit.data.integrity``), and the
    process count it was saved by; returns ``trainer_state.json``'s content."""
    missing = [name for name in STATE_FILES if not (path / name).exists()]
    if missing:
        raise ResumeError(f"{WHAT}: {path} lacks {', '.join(missing)}, so it cannot be resumed; {HOLDS}")
    state = read_json_file(path / STATE_FILE, WHAT)
    if not isinstance(state, dict) or "step" not in state or "prompts" not in state:
        raise corrupt(path / STATE_FILE, WHAT, "it has no step or data position")
    for name in STATE_FILES[1:]:
        check_torch_file(path / name, WHAT)
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        raise ResumeError(f"{WHAT}: {path} holds no model weights (*.safetensors); {HOLDS}")
    for file in weights:
        check_safetensors_file(file, WHAT)
    for name in ("config.json", "adapter_config.json"):
        if (path / name).exists():
            read_json_file(path / name, WHAT)
    if num_processes is not None:
        saved = len(load_checkpoint_file(path / RNG_FILE))
        if saved != num_processes:
            raise ResumeError(
                f"{WHAT}: {path} was saved by {saved} process(es), this run has {num_processes}; an exact "
                f"resume needs the same number of processes (launch {saved})"
            )
    return state


def saved_config(path: Path) -> dict[str, Any] | None:
    """The GRPOConfig values the checkpoint's run used, or None for a checkpoint that predates the record."""
    file = path / CONFIG_FILE
    if not file.exists():
        return None
    try:
        text = file.read_bytes().decode("utf-8")
        values = yaml.safe_load(text)
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise corrupt(file, WHAT, f"not valid YAML: {str(err).splitlines()[0]}") from None
    if not text.rstrip().endswith(END_OF_RECORD):  # a cut-off YAML mapping often still parses
        raise corrupt(file, WHAT, f"its last line, {END_OF_RECORD!r}, is missing")
    if not isinstance(values, dict):
        raise corrupt(file, WHAT, "not a mapping of GRPOConfig fields")
    return values


# -- what changed --
def config_changes(
    saved: dict[str, Any], new: dict[str, Any], checkpoint: str
) -> tuple[list[str], list[str]]:
    """``(honoured, refused)``: one sentence per changed field of ``new`` (YAML-typed as the checkpoint's
    record is) against ``saved``, by the field's rule (``parallel.resume_fields``)."""
    new = yaml.safe_load(yaml.safe_dump(new))  # the same types as the saved record (tuples -> lists ...)
    honoured, refused = [], []
    for name, value in new.items():
        if name not in saved or saved[name] == value:
            continue  # unchanged, or a field the checkpoint's version did not have
        old, rule = saved[name], rule_for(name)
        if rule.refuses(old, value):
            refused.append(
                f"{name} is {value!r} in this run but {old!r} in {checkpoint}: {rule.why}; resume with "
                f"{name}={_cli(old)}"
            )
        elif (how := rule.honours(old, value)) is not None:
            honoured.append(f"{name} {old!r} -> {value!r} (honoured: {how})")
    return honoured, refused


def _cli(value: Any) -> str:
    """A value as it is written on the command line (``null`` for None)."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def run_identity(rows: Sequence[Any] | None, model: Any) -> dict[str, Any]:
    """What a checkpoint must share with the run resuming it: the training rows (count and a fingerprint of
    their content) and the model's shape (architecture sizes, LoRA rank/alpha/targets)."""
    identity: dict[str, Any] = {}
    if rows is not None:
        digest = hashlib.sha256()
        for row in rows:
            digest.update(json.dumps(row, sort_keys=True, default=_content).encode())
            digest.update(b"\n")
        identity["train_rows"] = len(rows)
        identity["train_fingerprint"] = digest.hexdigest()[:16]
    if model is not None:
        identity["model"] = _model_shape(model)
    return identity


def _content(value: Any) -> str:
    """A value JSON cannot write, by its content: an image (PIL) by its mode, size and pixels, bytes by
    their hash, anything else as ``str`` (an image's ``str`` holds its memory address, not its pixels)."""
    if hasattr(value, "tobytes") and hasattr(value, "mode") and hasattr(value, "size"):
        return f"image {value.mode} {value.size} {hashlib.sha256(value.tobytes()).hexdigest()}"
    if isinstance(value, (bytes, bytearray)):
        return f"bytes {hashlib.sha256(value).hexdigest()}"
    return str(value)


def _model_shape(model: Any) -> dict[str, Any]:
    config = getattr(model, "config", None)
    values = config.to_dict() if hasattr(config, "to_dict") else {}
    shape: dict[str, Any] = {"architecture": {k: values[k] for k in ARCHITECTURE if k in values}}
    adapters = getattr(model, "peft_config", None)
    if adapters:
        adapter = next(iter(adapters.values()))
        targets = getattr(adapter, "target_modules", None)
        shape["adapters"] = {
            "r": getattr(adapter, "r", None),
            "lora_alpha": getattr(adapter, "lora_alpha", None),
            "target_modules": sorted(targets) if isinstance(targets, (set, list, tuple)) else targets,
        }
    else:
        shape["adapters"] = None
    return shape


def identity_refusals(saved: dict[str, Any], new: dict[str, Any], checkpoint: str, path: Path) -> list[str]:
    """One sentence per way ``new`` (``run_identity``) is not the checkpoint's run."""
    out = []
    fingerprints = saved.get("train_fingerprint"), new.get("train_fingerprint")
    if None not in fingerprints and fingerprints[0] != fingerprints[1]:
        counts = (
            f"{saved['train_rows']} rows then, {new['train_rows']} now"
            if saved["train_rows"] != new["train_rows"]
            else f"{new['train_rows']} rows both times, with other content"
        )
        out.append(
            f"train_dataset is not the one {checkpoint} trained on ({counts}): its data position would "
            "point into other prompts; resume with the same data (file, split, column_mapping, "
            f"num_train_examples), or start a new run from its weights (model={path})"
        )
    if "model" in saved and "model" in new:
        out += _shape_refusals(saved["model"], new["model"], checkpoint, path)
    return out


def _shape_refusals(saved: dict[str, Any], new: dict[str, Any], checkpoint: str, path: Path) -> list[str]:
    old_adapters, new_adapters = saved.get("adapters"), new.get("adapters")
    if (old_adapters is None) != (new_adapters is None):
        then = "LoRA adapters" if old_adapters else "all weights"
        now = "LoRA adapters" if new_adapters else "all weights"
        return [f"{checkpoint} trained {then} but this run trains {now}; resume with the same use_peft"]
    out = []
    for kind, old, now in (
        ("adapter", old_adapters or {}, new_adapters or {}),
        ("model", saved["architecture"], new["architecture"]),
    ):
        for key in sorted(set(old) & set(now)):
            if old[key] != now[key]:
                out.append(
                    f"the {kind}'s {key} is {now[key]!r} in this run but {old[key]!r} in {checkpoint}: its "
                    f"weights are of another shape; resume with the checkpoint's model and adapters"
                )
    return out


# -- the plan --
@dataclass
class ResumePlan:
    """A resume that passed every check: the checkpoint, its ``trainer_state.json``, the honoured changes."""

    path: Path
    state: dict[str, Any]
    honoured: list[str] = field(default_factory=list)

    @property
    def step(self) -> int:
        return int(self.state["step"])

    def log(self) -> None:
        for line in self.honoured:
            logger.warning("resuming %s: %s", self.path.name, line)


def plan_resume(
    resume: str | bool | Path,
    config: Any,
    output_dir: str | Path,
    *,
    identity: dict[str, Any] | None = None,
    num_processes: int | None = None,
    max_steps: int | None = None,
) -> ResumePlan:
    """Every check of the module docstring that the arguments allow (``identity``: ``run_identity`` of the
    run; ``max_steps``: its GRPO steps); raises :class:`ResumeError` (or ``CorruptFileError``) on the first
    file problem, or naming every refused change at once."""
    path = resolve_checkpoint(resume, output_dir)
    state = check_checkpoint_files(path, num_processes)
    checkpoint = f"{path.name} ({path})"
    honoured: list[str] = []
    refused: list[str] = []
    saved = saved_config(path)
    if saved is None:
        logger.warning(
            "resuming %s: it holds no %s (saved by an older grpokit), so this run's config cannot be checked "
            "against the checkpoint's",
            path,
            CONFIG_FILE,
        )
    elif config is not None:
        honoured, refused = config_changes(saved, _config_values(config), checkpoint)
    if identity is not None:
        refused += identity_refusals(state.get("run", {}), identity, checkpoint, path)
    if refused:
        raise ResumeError(f"{WHAT}: " + "; ".join(refused))
    step = int(state["step"])
    if max_steps is not None and step >= max_steps:
        raise ResumeError(
            f"{WHAT}: {checkpoint} is at step {step} and this run's max_steps is {max_steps}, so nothing is "
            f"left to train; raise max_steps above {step} to continue it"
        )
    return ResumePlan(path, state, honoured)


def _config_values(config: Any) -> dict[str, Any]:
    values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return {k: v for k, v in values.items() if k != "hub_token"}


def config_record(config: Any) -> str:
    """The text of a checkpoint's ``config.yaml``: the run's GRPOConfig without ``hub_token``, then
    ``END_OF_RECORD`` (so a file cut off between two fields is told from a whole one)."""
    return yaml.safe_dump(_config_values(config), sort_keys=False) + END_OF_RECORD + "\n"


# -- honouring the new optimizer settings --
@dataclass
class OptimizerSettings:
    """The optimizer's hyperparameters (per parameter group: lr, betas, eps, weight_decay, ...) and the
    schedule's base rates as this run built them, captured before the checkpoint is restored and put back
    after it: ``load_state_dict`` would otherwise bring the checkpoint's values back."""

    groups: list[dict[str, Any]]
    base_lrs: list[float] | None

    @classmethod
    def capture(cls, optimizer: Any, scheduler: Any) -> OptimizerSettings:
        groups = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
        scheduler = _unwrapped(scheduler)
        base_lrs = list(scheduler.base_lrs) if hasattr(scheduler, "base_lrs") else None
        return cls(groups, base_lrs)

    def restore(self, optimizer: Any, scheduler: Any) -> None:
        """This run's hyperparameters over the restored groups; the learning rate of the restored step
        recomputed from this run's schedule (the same value when nothing changed)."""
        if len(optimizer.param_groups) != len(self.groups):
            return  # an engine regrouped its parameters (DeepSpeed): its own values stay
        for group, built in zip(optimizer.param_groups, self.groups):
            for key, value in built.items():
                if key != "lr" and key in group:
                    group[key] = value
        scheduler = _unwrapped(scheduler)
        if self.base_lrs is None or not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
            return
        scheduler.base_lrs = list(self.base_lrs)
        step = scheduler.last_epoch
        rates = [base * fn(step) for fn, base in zip(scheduler.lr_lambdas, scheduler.base_lrs)]
        for group, rate in zip(optimizer.param_groups, rates):
            group["lr"] = rate
        scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


def _unwrapped(scheduler: Any) -> Any:
    """The torch scheduler inside accelerate's ``AcceleratedScheduler`` (or the one given)."""
    return getattr(scheduler, "scheduler", scheduler)
