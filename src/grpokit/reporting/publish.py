"""What a run publishes besides its weights: the model card (``README.md``) in every saved model folder, and
with ``push_to_hub`` the uploads (``hub_strategy``: at the end, or also at each checkpoint).

Only the main process writes or pushes. Hub access is checked when the trainer is built, so a missing token
stops the run before any training rather than after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from grpokit.reporting.hub import check_hub_access, push_model
from grpokit.reporting.model_card import base_model_name, dataset_name_of, write_model_card

__all__ = ["Publisher"]


class Publisher:
    """Writes the model card and pushes for one run."""

    def __init__(self, args: Any, model: Any, train_dataset: Any, *, is_main: bool) -> None:
        self.args, self.is_main = args, is_main
        self.pushing = bool(args.push_to_hub) and is_main
        self.repo_id = check_hub_access(args) if self.pushing else None
        self.base_model = base_model_name(model)
        self.dataset_name = dataset_name_of(train_dataset)

    def write_card(
        self,
        path: str | Path,
        reward_names: Sequence[str],
        read_metrics: Callable[[], list[dict[str, Any]]],
        eval_summary: dict | None = None,
        *,
        base_model: str | None = None,
        dataset_name: str | None = None,
    ) -> None:
        """``<path>/README.md`` from the run's settings, reward names and logged metrics (``read_metrics``:
        the metrics log so far, read only by the main process). ``base_model`` / ``dataset_name``: how to
        name them on the card when the caller knows better than the trainer's arguments (the command line's
        ``tiny:arithmetic`` rather than a cache directory); None: the trainer's."""
        if self.is_main:
            write_model_card(
                path, self.args, base_model=base_model or self.base_model,
                dataset_name=dataset_name or self.dataset_name,
                reward_names=list(reward_names), metrics=read_metrics(), eval_summary=eval_summary,
                model_id=self.repo_id,
            )  # fmt: skip

    def checkpoint_saved(
        self,
        path: Path,
        step: int,
        reward_names: Sequence[str],
        read_metrics: Callable[[], list[dict[str, Any]]],
    ) -> None:
        """``hub_strategy="every_save"``: push the checkpoint of ``step`` (its model, no optimizer state)
        with a card."""
        if self.pushing and self.args.hub_strategy == "every_save":
            self.write_card(path, reward_names, read_metrics)
            self.push(path, f"Training in progress, step {step}")

    def run_finished(
        self, reward_names: Sequence[str], read_metrics: Callable[[], list[dict[str, Any]]]
    ) -> None:
        """After the final ``save_model``: the card in output_dir, then the push."""
        self.write_card(self.args.output_dir, reward_names, read_metrics)
        self.push(self.args.output_dir, "End of training")

    def push(self, path: str | Path, message: str) -> str | None:
        """With ``push_to_hub`` (main process): upload ``path`` to the run's repository; its URL."""
        if self.pushing:
            return push_model(path, self.args, commit_message=message)
        return None
