"""A run owns its folder: what it is (a manifest), who is writing it (a lock), and what may start there.

Every command that writes a folder (``GRPOTrainer.train``, ``grpokit train``, ``grpokit train-rm``) claims it
here first:

* **the manifest** ``grpokit_run.json``: the run's kind (``train``, ``train-rm``), an id, a hash of its
  config, when it started, its state (``running``, ``finished``, ``interrupted``, ``failed``) and, once it
  ends, what it left (the step, whether a model was saved). It is rewritten atomically (written aside,
  then renamed) at each change of state;
* **the lock** ``.grpokit.lock``: an exclusive ``flock`` on that file, held while the run writes. The kernel
  releases it when the process ends, however it ends, so a dead process never leaves a stale lock; the
  file names the holder (process, host, start) for the message of a second run;
* **the rule**: a folder that holds another run's results (:data:`RESULT_ENTRIES`: checkpoints, metrics,
  completions, the evaluation, a saved model, a reward model) is refused, naming what it holds and the
  three ways out: another folder, ``resume_from_checkpoint`` (the same run, continued), or
  ``overwrite_output_dir=true``, which deletes those results *before* the new run writes anything (only
  grpokit's own files: anything else in the folder is left alone). A folder locked by a live process is
  refused at once. An empty folder, a folder holding only files grpokit does not write, or one whose run
  stopped before writing results (only ``config.yaml`` and the manifest) is taken.

Claims nest within one process: ``grpokit train`` claims the folder before the cold start, and the
trainer's ``train()`` inside it joins that claim (same kind) instead of locking again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpokit.data.integrity import InputError

try:  # POSIX: an flock the kernel releases with the process
    import fcntl
except ImportError:  # pragma: no cover - Windows: an exclusive file whose owner's liveness is checked
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "LOCK_FILE",
    "MANIFEST",
    "RESULT_ENTRIES",
    "Claim",
    "FolderState",
    "RunFolderError",
    "check_run_folder",
    "check_writable",
    "claim_run_folder",
    "config_hash",
    "expand_path",
    "folder_state",
    "held_claim",
    "refuse_another_runs_folder",
    "result_entries",
]

MANIFEST = "grpokit_run.json"
LOCK_FILE = ".grpokit.lock"
RUN_RECORD = "config.yaml"
"""Written when a run starts; alone it is no result (a run stopped before its first write left only it)."""

MODEL_ENTRIES: tuple[str, ...] = (
    "config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
    "pytorch_model*.bin", "adapter_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
    "chat_template.jinja", "chat_template.json", "training_args.bin", "README.md",
)  # fmt: skip
"""A saved ``transformers`` model, its tokenizer and model card (the policy, adapters, a reward model)."""

RESULT_ENTRIES: tuple[str, ...] = (
    # what a GRPO run writes
    "metrics.jsonl", "completions.jsonl", "metrics.png", "eval_summary.json", "reward_model", "tensorboard",
    "wandb",
    # what train-rm writes beside its model
    "metrics.json", "replay_buffer.jsonl",
    *MODEL_ENTRIES,
)  # fmt: skip
"""Names (and glob patterns) of the entries a grpokit run writes into its folder, besides
``checkpoint-<step>`` directories: what counts as a run's results, and all that ``overwrite_output_dir``
deletes."""

_CHECKPOINT = re.compile(r"^checkpoint-\d+(\.tmp)?$")
_STALE_WRITES = re.compile(r"^\.model\.tmp")  # a final save cut off (``write_aside``)


class RunFolderError(InputError):
    """A folder a run may not write: another run's results, a live run's lock, a file, or no permission."""


def expand_path(path: str | os.PathLike[str]) -> str:
    """``~`` and ``~user`` expanded (as a shell would), everything else as given."""
    return os.path.expanduser(os.fspath(path))


def config_hash(text: str) -> str:
    """A short, stable hash of a run's config record (its YAML or JSON text)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def result_entries(folder: str | Path) -> list[str]:
    """The names of the entries in ``folder`` that are a run's results (sorted; checkpoints by step)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = []
    for entry in folder.iterdir():
        name = entry.name
        if (
            _CHECKPOINT.match(name)
            or _STALE_WRITES.match(name)
            or (any(entry.match(pattern) for pattern in RESULT_ENTRIES) and not _empty_file(entry, name))
        ):
            found.append(name)
    return sorted(found, key=_display_order)


def _empty_file(entry: Path, name: str) -> bool:
    """An empty metrics or completions log (a run that stopped before its first logged step) is no result."""
    return name.endswith(".jsonl") and entry.is_file() and entry.stat().st_size == 0


def _display_order(name: str) -> tuple[int, int, str]:
    match = re.match(r"^checkpoint-(\d+)", name)
    return (1, int(match.group(1)), name) if match else (0, 0, name)


@dataclass
class FolderState:
    """What a folder holds: its manifest (None without one), its results, and who holds its lock."""

    path: Path
    manifest: dict[str, Any] | None
    results: list[str]
    holder: dict[str, Any] | None = None
    """The live process writing it (``pid``, ``host``, ``kind``, ``started``), or None."""
    held_here: bool = False
    """Whether this process holds it (an outer claim)."""

    def describe(self) -> str:
        """E.g. "a finished train run (started 2026-12-03 10:00:00 UTC)"; "an earlier run" without a
        manifest."""
        if self.manifest is None:
            return "an earlier run"
        kind, state = self.manifest.get("kind", "?"), self.manifest.get("state", "?")
        if state == "running":  # not locked any more: its process is gone
            state = "stopped (its process ended without closing it)"
        return f"a {state} {kind} run (started {self.manifest.get('started', '?')})"

    def listing(self) -> str:
        """The results in a few words: "checkpoint-1, checkpoint-2, metrics.jsonl, a saved model"."""
        model = [name for name in self.results if any(Path(name).match(p) for p in MODEL_ENTRIES)]
        checkpoints = [name for name in self.results if name.startswith("checkpoint-")]
        others = [name for name in self.results if name not in model and name not in checkpoints]
        if len(checkpoints) > 3:
            checkpoints = [f"{len(checkpoints)} checkpoints ({checkpoints[0]} to {checkpoints[-1]})"]
        return ", ".join([*checkpoints, *others, *(["a saved model"] if model else [])])


def read_manifest(folder: str | Path) -> dict[str, Any] | None:
    """The manifest of ``folder``, or None (none, or unreadable: a folder is never refused for a bad one)."""
    try:
        value = json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def folder_state(folder: str | Path, *, locked: bool = False) -> FolderState:
    """The manifest, results and lock holder of ``folder`` (which may not exist); ``locked``: the caller
    holds the lock (no holder to look for)."""
    path = Path(folder)
    held = _HELD.get(_key(path))
    holder = None if held is not None or locked else _lock_holder(path)
    return FolderState(path, read_manifest(path), result_entries(path), holder, held is not None)


def check_run_folder(
    folder: str | Path,
    kind: str,
    *,
    resume: bool = False,
    overwrite: bool = False,
    reads: Sequence[str | Path] = (),
    field_name: str = "output_dir",
    overwrite_name: str = "overwrite_output_dir=true",
    locked: bool = False,
    resume_may_follow: bool = False,
) -> FolderState:
    """Whether a ``kind`` run may write ``folder``; a :class:`RunFolderError` with the way out if not.

    ``resume``: the run continues the one in the folder (its results are its own). ``overwrite``: the
    folder's results will be deleted (refused when the folder holds what the run ``reads``: its model or
    data). ``field_name`` / ``overwrite_name``: the option names the messages use. ``locked``: the caller
    has just taken the folder's lock (the check under it). ``resume_may_follow``: a folder the run could
    still resume (a complete checkpoint of the same kind) passes: ``train(resume_from_checkpoint=...)``
    decides later."""
    path = Path(folder)
    check_writable(path, field_name)
    state = folder_state(path, locked=locked)
    held = _HELD.get(_key(path))
    if held is not None and held.kind != kind:
        raise RunFolderError(
            f"{field_name} {path} is being written by a {held.kind} run in this process; choose another "
            f"{field_name}"
        )
    if state.holder is not None:
        who = state.holder
        raise RunFolderError(
            f"{field_name} {path} is in use: a {who.get('kind', '?')} run (process {who.get('pid', '?')} on "
            f"{who.get('host', '?')}, started {who.get('started', '?')}) is writing it now; wait for it to "
            f"end, or choose another {field_name}"
        )
    if held is not None or not state.results:
        return state
    if resume:
        previous = (state.manifest or {}).get("kind", kind)
        if previous != kind:
            raise RunFolderError(
                f"{field_name} {path} holds {state.describe()}, not a {kind} run: it cannot be resumed as "
                f"one; choose another {field_name}"
            )
        return state
    if overwrite:
        _refuse_to_delete_inputs(path, reads, field_name, overwrite_name)
        return state
    checkpoints = [name for name in state.results if _CHECKPOINT.match(name) and not name.endswith(".tmp")]
    same_kind = (state.manifest or {}).get("kind", kind) == kind
    if resume_may_follow and checkpoints and same_kind:
        return state
    resume_hint = "resume_from_checkpoint=latest to continue it, " if checkpoints and kind == "train" else ""
    raise RunFolderError(
        f"{field_name} {path} holds the results of {state.describe()}: {state.listing()}. Choose another "
        f"{field_name}, {resume_hint}or {overwrite_name} to delete them first"
    )


def refuse_another_runs_folder(
    folder: str | Path, run_id: str | None, field_name: str = "save_model"
) -> None:
    """Writing a model into ``folder`` is refused when another grpokit run holds it: a live process, or its
    manifest with results (``run_id``: the writer's own run, which may)."""
    path = Path(folder)
    check_writable(path, field_name)
    state = folder_state(path)
    if state.holder is not None:
        raise RunFolderError(
            f"{field_name}: {path} is being written by a {state.holder.get('kind', '?')} run (process "
            f"{state.holder.get('pid', '?')}); choose another folder"
        )
    owner = (state.manifest or {}).get("run_id")
    if state.manifest is not None and state.results and owner != run_id and not state.held_here:
        raise RunFolderError(
            f"{field_name}: {path} holds the results of {state.describe()}: {state.listing()}; choose "
            "another folder (or delete them first)"
        )


def check_writable(path: Path, field_name: str) -> None:
    """A folder that is a file, under a file, or not writable is refused before anything runs."""
    if path.exists() and not path.is_dir():
        raise RunFolderError(f"{field_name} {path} is a file, not a folder; give a folder path")
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise RunFolderError(f"{field_name} {path}: {existing} is a file, so no folder can be made there")
    if existing.exists() and not os.access(existing, os.W_OK | os.X_OK):
        raise RunFolderError(f"{field_name} {path}: {existing} is not writable by this user")


def _refuse_to_delete_inputs(
    path: Path, reads: Sequence[str | Path], field_name: str, overwrite: str
) -> None:
    """``overwrite`` must not delete the model or data the run reads from the same folder."""
    here = path.resolve()
    for source in reads:
        if not isinstance(source, (str, os.PathLike)) or not os.path.exists(expand_path(source)):
            continue
        target = Path(expand_path(source)).resolve()
        inside = target == here or (target.parent == here and any(target.match(p) for p in RESULT_ENTRIES))
        if inside:
            raise RunFolderError(
                f"{field_name} {path} holds {source}, which this run reads: {overwrite} would delete it "
                f"before it is loaded; choose another {field_name}"
            )


def clear_results(folder: str | Path) -> list[str]:
    """Delete every result entry of ``folder`` (and its manifest); returns what was deleted."""
    path = Path(folder)
    removed = result_entries(path)
    for name in [*removed, RUN_RECORD, MANIFEST]:
        entry = path / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif entry.exists() or entry.is_symlink():
            entry.unlink()
    return removed


# -- claims ---------------------------------------------------------------------------------------------
@dataclass
class Claim:
    """A run's hold on its folder: the lock, and the manifest it keeps current (``update``)."""

    path: Path
    kind: str
    manifest: dict[str, Any]
    fd: int | None = None
    depth: int = 1
    removed: list[str] = field(default_factory=list)
    """What ``overwrite`` deleted when the claim was taken."""
    recording: bool = True
    """False on a run's other processes: the manifest is the main process's."""

    def update(self, **values: Any) -> None:
        """Record ``values`` in the manifest (``state="finished"``, ``step=...``), written atomically."""
        self.manifest.update(values, updated=_now())
        if self.recording:
            _write_atomic(self.path / MANIFEST, json.dumps(self.manifest, indent=2) + "\n")

    @property
    def run_id(self) -> str | None:
        value = self.manifest.get("run_id")
        return None if value is None else str(value)


_HELD: dict[str, Claim] = {}
"""The folders this process holds, by resolved path: a nested claim joins the outer one."""


def _key(path: Path) -> str:
    return str(path.expanduser().resolve())


def held_claim(folder: str | Path) -> Claim | None:
    """This process's claim on ``folder``, or None."""
    return _HELD.get(_key(Path(folder)))


@contextlib.contextmanager
def claim_run_folder(
    folder: str | Path,
    kind: str,
    *,
    config_text: str = "",
    resume: bool = False,
    overwrite: bool = False,
    reads: Sequence[str | Path] = (),
    details: dict[str, Any] | None = None,
    field_name: str = "output_dir",
    overwrite_name: str = "overwrite_output_dir=true",
    enabled: bool = True,
) -> Iterator[Claim]:
    """Hold ``folder`` for a ``kind`` run while the block runs: checked (:func:`check_run_folder`), locked,
    its old results deleted first when ``overwrite``, the manifest written (``running``). The block ends
    the run with ``claim.update(state=...)``; one that raises leaves ``interrupted`` (a signal,
    ``KeyboardInterrupt``) or ``failed``, and the lock is released whatever happens. A claim on a folder
    this process already holds (same kind) joins it: the outer claim's lock and manifest. ``enabled=False``
    (a process other than a run's main one) takes nothing: its claim records nothing."""
    path = Path(folder)
    if not enabled:  # another process of the run: the main one holds the folder
        yield Claim(path, kind, {"run_id": None}, recording=False)
        return
    outer = _HELD.get(_key(path))
    if outer is not None and outer.kind == kind:
        outer.depth += 1
        try:
            yield outer
        finally:
            outer.depth -= 1
        return
    names = {"field_name": field_name, "overwrite_name": overwrite_name}
    check_run_folder(path, kind, resume=resume, overwrite=overwrite, reads=reads, **names)
    path.mkdir(parents=True, exist_ok=True)
    fd = _lock(path, kind)
    try:  # checked again under the lock: another process may have written between the check and the lock
        state = check_run_folder(
            path, kind, resume=resume, overwrite=overwrite, reads=reads, locked=True, **names
        )
        removed = clear_results(path) if overwrite and state.results and not resume else []
        previous = (
            state.manifest if resume and state.manifest and state.manifest.get("kind") == kind else None
        )
        manifest = _new_manifest(kind, config_text, previous, details)
        claim = Claim(path, kind, manifest, fd, removed=removed)
        claim.update()
    except BaseException:
        _unlock(path, fd)
        raise
    _HELD[_key(path)] = claim
    try:
        yield claim
    except BaseException as error:
        if claim.manifest.get("state") == "running":
            interrupted = isinstance(error, KeyboardInterrupt)
            claim.update(state="interrupted" if interrupted else "failed", error=_first_line(error))
        raise
    finally:
        try:
            if claim.manifest.get("state") == "running":  # the block ended without saying how
                claim.update(state="interrupted")
        finally:  # released whatever happens above (a signal in the update included)
            _HELD.pop(_key(path), None)
            _unlock(path, fd)


def _new_manifest(
    kind: str, config_text: str, previous: dict[str, Any] | None, details: dict[str, Any] | None
) -> dict[str, Any]:
    manifest: dict[str, Any] = {
        "kind": kind,
        "run_id": uuid.uuid4().hex[:12],
        "state": "running",
        "config_hash": config_hash(config_text),
        "started": _now(),
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }
    if previous is not None:  # a resume continues the run: its id and start, and when it was resumed
        manifest.update(run_id=previous.get("run_id", manifest["run_id"]), started=previous.get("started"))
        manifest["resumed"] = [*previous.get("resumed", []), _now()]
    manifest.update(details or {})
    return manifest


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# -- the lock -------------------------------------------------------------------------------------------
def _lock(path: Path, kind: str) -> int:
    """Take the folder's lock (at once, or a RunFolderError naming the holder); returns its descriptor."""
    file = path / LOCK_FILE
    fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
    try:  # (a signal at any point here closes the descriptor: no lock is left held)
        if not _try_lock(fd, file):
            holder = _read_holder(file) or {}
            raise RunFolderError(
                f"output_dir {path} is in use: a {holder.get('kind', '?')} run (process "
                f"{holder.get('pid', '?')} on {holder.get('host', '?')}) took it a moment ago; choose "
                "another output_dir"
            )
        record = {"pid": os.getpid(), "host": socket.gethostname(), "kind": kind, "started": _now()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _try_lock(fd: int, file: Path) -> bool:
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
    holder = _read_holder(file)  # pragma: no cover - without flock: a live owner on this host holds it
    return holder is None or not _alive(holder)


def _unlock(path: Path, fd: int | None) -> None:
    """Release the lock: closing the descriptor releases the flock (the file's record of the holder is
    stale from then on; only the flock says who holds it)."""
    if fd is not None:
        os.close(fd)


def _lock_holder(path: Path) -> dict[str, Any] | None:
    """The live process holding ``path``'s lock (another process), or None."""
    file = path / LOCK_FILE
    if not file.exists():
        return None
    try:
        fd = os.open(file, os.O_RDWR)
    except OSError:
        return None
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return _read_holder(file) or {}
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        holder = _read_holder(file)  # pragma: no cover
        return holder if holder is not None and _alive(holder) else None
    finally:
        os.close(fd)


def _read_holder(file: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(file.read_text() or "null")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _alive(holder: dict[str, Any]) -> bool:  # pragma: no cover - used without flock only
    if holder.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(holder.get("pid", -1)), 0)
    except (OSError, ValueError):
        return False
    return True
