"""The run's metric log: ``metrics.jsonl`` (always) plus the experiment trackers that ``report_to`` names
(``grpokit.reporting.tracking``), and the end-of-run plot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from grpokit.data.records import append_jsonl, json_number, read_jsonl
from grpokit.reporting.tracking import RunInfo, Sink, open_sinks, resolve_sinks

__all__ = ["COMPARED", "PLOTTED", "MetricsLogger", "plot_metrics", "plot_runs", "seed_curve"]

PLOTTED: tuple[str | tuple[str, ...], ...] = (
    "reward",
    "kl",
    "completions/mean_length",
    "entropy",
    ("proxy_gold/proxy_mean", "proxy_gold/gold_mean"),
    ("proxy_gold/accuracy", "rm/accuracy_on_policy"),
    "selfplay/exploitability",
)
"""The end-of-run plot's panels: a metric, or a tuple of metrics drawn together (the proxy reward against the
gold reward; the reward model's accuracy on the policy's samples; a Kuhn poker run's exploitability). A
panel without data is left out."""


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
    records: list[dict[str, Any]], path: str | Path, names: Sequence[str | tuple[str, ...]] = PLOTTED
) -> Path | None:
    """Plot the named metrics against step into one PNG, one panel per entry of ``names`` (a tuple of names:
    one panel with a line each). Metrics without a value are left out. Returns the path or None."""
    panels = [
        shown
        for entry in names
        if (shown := [n for n in ((entry,) if isinstance(entry, str) else entry) if _has(records, n)])
    ]
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3), squeeze=False)
    for axis, panel in zip(axes[0], panels):
        for name in panel:
            points = [(r["step"], r[name]) for r in records if r.get(name) is not None]
            axis.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=name)
        axis.set_title(panel[0] if len(panel) == 1 else " vs ".join(n.split("/")[-1] for n in panel))
        if len(panel) > 1:
            axis.legend(fontsize=7)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def _has(records: list[dict[str, Any]], name: str) -> bool:
    return any(r.get(name) is not None for r in records)


COMPARED = ("proxy_gold/gold_mean", "proxy_gold/proxy_mean", "kl", "proxy_gold/accuracy")
"""The panels of :func:`plot_runs` by default: the over-optimisation curves of runs on a learned reward."""


def seed_curve(runs: Sequence[list[dict[str, Any]]], name: str) -> list[tuple[int, float, float, float]]:
    """``(step, mean, min, max)`` of metric ``name`` over the runs (seeds) that logged it at each step, in
    step order; steps no run logged it at are left out."""
    by_step: dict[int, list[float]] = {}
    for records in runs:
        for record in records:
            if record.get(name) is not None:
                by_step.setdefault(int(record["step"]), []).append(float(record[name]))
    return [(step, sum(v) / len(v), min(v), max(v)) for step, v in sorted(by_step.items())]


def plot_runs(
    runs: Mapping[str, Sequence[str | Path]], path: str | Path, names: Sequence[str] = COMPARED
) -> Path:
    """Compare runs: ``runs`` maps a label (a recipe) to its output directories (one per seed); each panel
    (a metric of ``names``) draws, per label, the mean over seeds at each step with the min-max band. Reads
    each directory's metrics.jsonl."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logs = {
        label: [read_jsonl(Path(d) / "metrics.jsonl", str(d)) for d in dirs] for label, dirs in runs.items()
    }
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3), squeeze=False)
    for axis, name in zip(axes[0], names):
        for label, records in logs.items():
            curve = seed_curve(records, name)
            if not curve:
                continue
            steps = [c[0] for c in curve]
            line = axis.plot(steps, [c[1] for c in curve], label=label)[0]
            axis.fill_between(steps, [c[2] for c in curve], [c[3] for c in curve], alpha=0.2,
                              color=line.get_color())  # fmt: skip
        axis.set_title(name)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
