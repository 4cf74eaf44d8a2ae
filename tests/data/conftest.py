"""Data tests never reach the network and never write to the user's ``datasets`` cache: offline mode (a
hub name fails at once, as on a machine without network) and a cache folder per test."""

from __future__ import annotations

import datasets
import pytest


@pytest.fixture(autouse=True)
def _offline_private_cache(monkeypatch, tmp_path):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets-cache")
