"""Metric sinks: metrics.jsonl (always), TensorBoard / Weights & Biases (opt-in), and the end-of-run plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpokit.records import append_jsonl, json_number, read_jsonl

__all__ = ["PLOTTED", "MetricsLogger", "plot_metrics"]

PLOTTED = ("reward", "kl", "completions/mean_length", "entropy")


class MetricsLogger:
    """Appends one JSON object per logged step to ``<output_dir>/metrics.jsonl``."""

    def __init__(
        self, output_dir: str | Path, report_to: list[str] | None = None, enabled: bool = True
    ) -> None:
        self.path = Path(output_dir) / "metrics.jsonl"
        self.enabled = enabled
        self._sinks: list[Any] = []
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for name in report_to or []:
            self._sinks.append(_make_sink(name, Path(output_dir)))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        append_jsonl(self.path, [{"step": step, **{k: json_number(v) for k, v in metrics.items()}}])
        for sink in self._sinks:
            sink(step, metrics)

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return read_jsonl(self.path, "metrics log")


def _make_sink(name: str, output_dir: Path):
    if name == "tensorboard":
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:  # pragma: no cover - depends on the optional extra
            raise ImportError("report_to tensorboard needs `pip install grpokit[tensorboard]`") from err
        writer = SummaryWriter(str(output_dir / "tensorboard"))
        return lambda step, metrics: [writer.add_scalar(k, float(v), step) for k, v in metrics.items()]
    if name == "wandb":
        try:
            import wandb
        except ImportError as err:  # pragma: no cover - depends on the optional extra
            raise ImportError("report_to wandb needs `pip install grpokit[wandb]`") from err
        run = wandb.init(dir=str(output_dir))
        return lambda step, metrics: run.log(dict(metrics), step=step)
    raise ValueError(f"GRPOConfig.report_to: unknown sink {name!r}; use 'tensorboard' or 'wandb'")


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
