"""The run's metric log: ``metrics.jsonl`` (always) plus the experiment trackers that ``report_to`` names
(``grpokit.reporting.tracking``), and the end-of-run plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from grpokit.data.records import append_jsonl, json_number, read_jsonl
from grpokit.reporting.tracking import RunInfo, Sink, open_sinks, resolve_sinks

__all__ = ["PLOTTED", "MetricsLogger", "plot_metrics"]

PLOTTED = ("reward", "kl", "completions/mean_length", "entropy")


class MetricsLogger:
    """Appends one JSON object per logged step to ``<output_dir>/metrics.jsonl`` and sends the same
    metrics to each tracker in ``report_to`` (TensorBoard, W&B, trackio, MLflow).

    ``close()`` ends every tracker (idempotent); the logger is also a context manager that closes on
    exit, marking the tracker runs failed when the block raised (``close(failed=True)``). A logger with
    ``enabled=False`` (a process other than the main one) writes and opens nothing.
    """

    def __init__(
        self,
        output_dir: str | Path,
        report_to: str | Sequence[str] | None = None,
        enabled: bool = True,
        *,
        run: RunInfo | None = None,
    ) -> None:
        self.path = Path(output_dir) / "metrics.jsonl"
        self.enabled = enabled
        self.sinks: list[Sink] = []
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.sinks = open_sinks(resolve_sinks(report_to), run or RunInfo(output_dir=Path(output_dir)))

    @classmethod
    def from_config(cls, args: Any, *, enabled: bool) -> MetricsLogger:
        """The logger of a ``GRPOConfig``'s run: ``output_dir``, ``report_to``, and for the trackers
        ``project``, ``run_name`` (default: output_dir's last component), ``logging_dir`` (TensorBoard;
        default ``<output_dir>/tensorboard``) and every field as the run's configuration."""
        if not enabled:
            return cls(args.output_dir, enabled=False)
        return cls(args.output_dir, args.report_to, True, run=RunInfo.from_config(args))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Append ``metrics`` at ``step`` to metrics.jsonl (NaN/inf as null) and send them to the trackers."""
        if not self.enabled:
            return
        append_jsonl(self.path, [{"step": step, **{k: json_number(v) for k, v in metrics.items()}}])
        for sink in self.sinks:
            sink.log(step, metrics)

    def read(self) -> list[dict[str, Any]]:
        """Every record of metrics.jsonl so far ([] before the first)."""
        if not self.path.exists():
            return []
        return read_jsonl(self.path, "metrics log")

    def close(self, *, failed: bool = False) -> None:
        """Flush and close every tracker: finish the W&B / trackio / MLflow run (``failed``: mark it
        failed, W&B exit code 1 and MLflow FAILED). Every sink is closed even if one raises; the first
        error is raised after. A second call does nothing; metrics.jsonl stays writable."""
        sinks, self.sinks = self.sinks, []
        first: BaseException | None = None
        for sink in sinks:  # every sink is closed even when one of them fails; the first error is raised
            try:
                sink.close(failed=failed)
            except BaseException as err:  # re-raised below, after the other sinks are closed
                first = first or err
        if first is not None:
            raise first

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close(failed=exc_type is not None)


def plot_metrics(
    records: list[dict[str, Any]], path: str | Path, names: tuple[str, ...] = PLOTTED
) -> Path | None:
    """Plot the named metrics against step into one PNG (one panel each). Returns the path or None."""
    names = tuple(n for n in names if any(r.get(n) is not None for r in records))
    if not names:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3), squeeze=False)
    for axis, name in zip(axes[0], names):
        points = [(r["step"], r[name]) for r in records if r.get(name) is not None]
        axis.plot([p[0] for p in points], [p[1] for p in points], marker=".")
        axis.set_title(name)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
