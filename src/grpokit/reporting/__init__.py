"""What a run tells the world: metrics, logs, trackers, callbacks, the model card and the hub upload.

Step metrics and phase timers (``metrics``), the metrics log and its plot (``metrics_log``), trackers
(``tracking``), completions (``completion_log``), callbacks (``callbacks``), the model card
(``model_card``) and the hub upload (``hub``, ``publish``)."""

from grpokit.reporting.callbacks import Callbacks
from grpokit.reporting.metrics import PhaseTimer, step_metrics
from grpokit.reporting.metrics_log import MetricsLogger, plot_metrics
from grpokit.reporting.publish import Publisher

__all__ = ["Callbacks", "MetricsLogger", "PhaseTimer", "Publisher", "plot_metrics", "step_metrics"]
