"""Data sets in, validated prompt rows out (``loading``); the built-in generated tasks live in ``tasks``."""

from grpokit.data.loading import load_dataset_rows, load_rows, reward_columns, validate_rows

__all__ = ["load_dataset_rows", "load_rows", "reward_columns", "validate_rows"]
