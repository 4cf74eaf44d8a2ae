"""The tiny VLM architectures as pytest parameters: every one of ``VISION_ARCHITECTURES``, those this
environment cannot build (Qwen's processors without torchvision) skipped with the reason."""

from __future__ import annotations

import pytest

from grpokit.models.tiny_vision import QWEN_NEEDS, VISION_ARCHITECTURES, available_architectures

ARCHITECTURES = [
    pytest.param(arch, marks=pytest.mark.skipif(arch not in available_architectures(), reason=QWEN_NEEDS))
    for arch in VISION_ARCHITECTURES
]
