"""Data sets in, validated prompt rows out; chat rendering of prompts and completions.

``loading`` (names, files, Datasets, column mapping), ``sources``, ``chat``, ``records``; the built-in
generated tasks live in ``grpokit.tasks``."""

from grpokit.data.loading import DataSettings, load_dataset_rows, load_rows, reward_columns, validate_rows

__all__ = ["DataSettings", "load_dataset_rows", "load_rows", "reward_columns", "validate_rows"]
