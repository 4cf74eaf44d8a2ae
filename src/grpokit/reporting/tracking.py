"""Experiment trackers that receive the logged metrics besides ``metrics.jsonl``: TensorBoard, Weights &
Biases, trackio and MLflow (``GRPOConfig.report_to``).

Each tracker is a sink with ``log(step, metrics)`` and ``close(failed)``; its package is optional and comes
with the pip extra of the same name (``pip install 'grpokit[wandb]'``). ``open_sinks`` checks every
requested package before opening any sink, so a missing one fails fast with an ImportError naming the
extra and leaves nothing half open.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from grpokit.config.choices import SINKS

__all__ = [
    "SINKS",
    "MLflowSink",
    "RunInfo",
    "Sink",
    "TensorBoardSink",
    "TrackioSink",
    "WandbSink",
    "installed_sinks",
    "open_sinks",
    "require_sink_packages",
    "resolve_sinks",
]

_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio", "mlflow": "mlflow"}
"""The package each sink imports (its pip extra has the sink's name)."""


@dataclass(frozen=True)
class RunInfo:
    """What the trackers are told about the run: where it writes, its project and name, and its settings."""

    output_dir: Path
    project: str = "grpokit"
    run_name: str | None = None
    logging_dir: str | Path | None = None
    config: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, args: Any) -> RunInfo:
        """The run described by a ``GRPOConfig``: its tracking fields, and every field as the config (a
        ``*_token`` field that is set, such as ``hub_token``, as ``<redacted>``: trackers are shared)."""
        config = {
            key: "<redacted>" if key.endswith("_token") and value is not None else value
            for key, value in args.to_dict().items()
        }
        return cls(
            output_dir=Path(args.output_dir),
            project=args.project,
            run_name=args.run_name,
            logging_dir=args.logging_dir,
            config=config,
        )

    @property
    def name(self) -> str:
        """``run_name``, or the output directory's last component."""
        return self.run_name or Path(os.path.abspath(self.output_dir)).name

    @property
    def tensorboard_dir(self) -> Path:
        """``logging_dir``, or ``<output_dir>/tensorboard``."""
        return Path(self.logging_dir) if self.logging_dir else Path(self.output_dir) / "tensorboard"


class Sink(Protocol):
    """One tracker: receives every logged step, and is closed once at the end."""

    name: str

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record ``metrics`` at ``step``."""

    def close(self, failed: bool = False) -> None:
        """Write out what is buffered and end the run (``failed``: the training ended with an error)."""


def _importable(module: str) -> bool:
    """Whether ``module`` is installed (found without importing it)."""
    return importlib.util.find_spec(module) is not None


def installed_sinks() -> list[str]:
    """The sinks whose package can be imported here, in ``SINKS`` order."""
    return [name for name in SINKS if _importable(_MODULES[name])]


def resolve_sinks(report_to: str | Sequence[str] | None) -> list[str]:
    """``report_to`` as the sink names to open, each once: "none" / "" / None mean none, "all" every
    installed one (none installed: none, not an error). An unknown name is a ValueError."""
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    chosen: list[str] = []
    for raw in names:
        name = raw.strip()
        if name in ("", "none"):
            continue
        if name == "all":
            chosen.extend(installed_sinks())
        elif name in SINKS:
            chosen.append(name)
        else:
            raise ValueError(f"report_to: unknown sink {name!r}; use {', '.join(SINKS)}, 'all' or 'none'")
    return list(dict.fromkeys(chosen))


def require_sink_packages(names: Sequence[str]) -> None:
    """Every named sink's package is installed: a missing one is an ImportError naming its pip extra."""
    for name in names:
        if not _importable(_MODULES[name]):
            raise ImportError(
                f"report_to={name!r} needs the {_MODULES[name]} package: pip install 'grpokit[{name}]'"
            )


def open_sinks(names: Sequence[str], run: RunInfo) -> list[Sink]:
    """Open the named sinks for ``run``. Every package is checked first (``require_sink_packages``). If
    opening one fails, those already open are closed before the error propagates."""
    require_sink_packages(names)
    sinks: list[Sink] = []
    try:
        for name in names:
            sinks.append(_OPENERS[name](run))
    except BaseException:
        for sink in sinks:
            sink.close(failed=True)
        raise
    return sinks


def _numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics as floats (NaN and inf kept), leaving out values that are not numbers."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    return out


class TensorBoardSink:
    """Scalars in TensorBoard event files under ``run.tensorboard_dir``, flushed at every ``log`` so that
    a short or interrupted run leaves them on disk; the configuration as the text ``config``."""

    name = "tensorboard"

    def __init__(self, run: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = run.tensorboard_dir
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        if run.config:
            text = json.dumps(dict(run.config), indent=2, default=str)
            self.writer.add_text("config", "\n".join("    " + line for line in text.splitlines()))
            self.writer.flush()

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Add each metric as a scalar at ``step`` and flush the event file."""
        for key, value in _numbers(metrics).items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self, failed: bool = False) -> None:
        """Flush and close the event file."""
        self.writer.close()


class WandbSink:
    """A Weights & Biases run named ``run.name`` in ``run.project``, with the configuration, files under
    ``<output_dir>/wandb``; ``WANDB_MODE=offline`` keeps it local. A run the caller already started
    (``wandb.run``) is logged to and left open for its owner."""

    name = "wandb"

    def __init__(self, run: RunInfo) -> None:
        import wandb

        self.owned = wandb.run is None
        if self.owned:
            Path(run.output_dir).mkdir(parents=True, exist_ok=True)
            self.run = wandb.init(
                project=run.project, name=run.name, config=dict(run.config), dir=str(run.output_dir)
            )
        else:
            self.run = wandb.run
            self.run.config.update(dict(run.config), allow_val_change=True)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log the metrics at ``step``."""
        self.run.log(_numbers(metrics), step=step)

    def close(self, failed: bool = False) -> None:
        """Finish the run (exit code 1 when the training failed), unless the caller started it."""
        if self.owned:
            self.run.finish(exit_code=1 if failed else 0)


class TrackioSink:
    """A trackio run named ``run.name`` in project ``run.project``, with the configuration. trackio writes
    to its local database (``TRACKIO_DIR``, default ``~/.cache/huggingface/trackio``; ``trackio show``
    opens the dashboard)."""

    name = "trackio"

    def __init__(self, run: RunInfo) -> None:
        import trackio

        self._trackio = trackio
        self.run = trackio.init(project=run.project, name=run.name, config=dict(run.config))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log the metrics at ``step``."""
        self.run.log(_numbers(metrics), step=step)

    def close(self, failed: bool = False) -> None:
        """Finish the run: write what is queued and stop its background threads."""
        context = getattr(self._trackio, "context_vars", None)
        current = getattr(context, "current_run", None)
        if current is not None and current.get() is self.run:
            self._trackio.finish()  # also clears trackio's current run
        else:
            self.run.finish()


_MLFLOW_BAD_CHARS = re.compile(r"[^\w./\- ]")


def _mlflow_key(key: str) -> str:
    """``key`` as a valid MLflow name: characters MLflow refuses become ``_``, empty / . / .. parts go."""
    parts = [part for part in _MLFLOW_BAD_CHARS.sub("_", key).split("/") if part not in ("", ".", "..")]
    return "/".join(parts) or "_"


class MLflowSink:
    """An MLflow run named ``run.name`` in the experiment ``run.project`` (created if missing), the
    configuration as its parameters, finished (or failed) at ``close``. The tracking store is MLflow's
    own choice: ``MLFLOW_TRACKING_URI`` (a server, a database), else MLflow's default (the full mlflow
    package: ``sqlite:///mlflow.db`` in the working directory). A store that cannot be opened is a
    RuntimeError that says so. A run the caller already started (``mlflow.start_run``) is logged to and
    left open."""

    name = "mlflow"

    def __init__(self, run: RunInfo) -> None:
        import mlflow
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.utils import validation

        self._max_metrics = getattr(validation, "MAX_METRICS_PER_BATCH", 1000)
        active = mlflow.active_run()
        self.owned = active is None
        try:
            self.client = mlflow.MlflowClient()
            if active is not None:
                self.run_id = active.info.run_id
            else:
                experiment = self.client.get_experiment_by_name(run.project)
                experiment_id = (
                    experiment.experiment_id if experiment else self.client.create_experiment(run.project)
                )
                self.run_id = self.client.create_run(experiment_id, run_name=run.name).info.run_id
        except MlflowException as err:
            raise RuntimeError(
                f"report_to='mlflow': MLflow cannot open its tracking store {mlflow.get_tracking_uri()!r}. "
                "Set MLFLOW_TRACKING_URI to a tracking server (http://host:5000) or to a store this MLflow "
                "install supports (a local sqlite:///mlflow.db needs the full mlflow package, "
                f"pip install 'grpokit[mlflow]'). MLflow said: {err}"
            ) from err
        longest = getattr(validation, "MAX_PARAM_VAL_LENGTH", 500)
        params = [Param(_mlflow_key(k), str(v)[:longest]) for k, v in run.config.items()]
        per_batch = getattr(validation, "MAX_PARAMS_TAGS_PER_BATCH", 100)
        for start in range(0, len(params), per_batch):
            self.client.log_batch(self.run_id, params=params[start : start + per_batch])

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log the metrics at ``step`` (names MLflow refuses are made valid, see ``_mlflow_key``)."""
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        entries = [Metric(_mlflow_key(k), v, stamp, step) for k, v in _numbers(metrics).items()]
        for start in range(0, len(entries), self._max_metrics):
            self.client.log_batch(self.run_id, metrics=entries[start : start + self._max_metrics])

    def close(self, failed: bool = False) -> None:
        """Mark the run FINISHED (FAILED when the training failed), unless the caller started it."""
        if self.owned:
            self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


_OPENERS: dict[str, Callable[[RunInfo], Sink]] = {
    "tensorboard": TensorBoardSink,
    "wandb": WandbSink,
    "trackio": TrackioSink,
    "mlflow": MLflowSink,
}
