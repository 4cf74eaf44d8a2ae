"""bf16 matrix-unit detection (``grpokit.parallel.hardware``): flags read as /proc/cpuinfo states them, and
the answer for each kind of processor."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from grpokit.parallel import hardware


def test_cpu_flags_are_those_of_proc_cpuinfo():
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo")
    lines = [
        line
        for line in cpuinfo.read_text().splitlines()
        if line.split(":")[0].strip() in ("flags", "Features")
    ]
    expected = set(lines[0].split(":", 1)[1].split()) if lines else set()
    assert hardware.cpu_flags() == expected
    support = hardware.bf16_support("cpu")
    assert set(support.features) == expected & set(hardware.CPU_FEATURES)
    assert support.matrix_units == hardware.has_bf16_matrix_units()


@pytest.mark.parametrize(
    ("flags", "machine", "units"),
    [
        ({"avx512f", "avx512_bf16"}, "x86_64", False),  # a bf16 dot-product instruction, no matrix unit
        ({"avx512_bf16", "amx_tile", "amx_bf16"}, "x86_64", True),  # Sapphire Rapids' AMX
        ({"avx2"}, "x86_64", False),
        ({"asimd", "bf16", "i8mm"}, "aarch64", True),  # Armv8.6 BF16: BFMMLA
        ({"asimd"}, "aarch64", False),
    ],
)
def test_matrix_units_by_processor(monkeypatch, flags, machine, units):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(hardware.platform, "machine", lambda: machine)
    assert hardware.has_bf16_matrix_units("cpu") is units
    assert hardware.has_bf16_matrix_units() is units  # None: the CPU


def test_the_trainer_start_logs_it(monkeypatch, caplog):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"amx_bf16", "avx512_bf16"}))
    with caplog.at_level(logging.INFO, logger="grpokit.parallel.hardware"):
        support = hardware.log_bf16_support("cpu", "no")
    assert support.matrix_units
    assert "cpu: bf16 matrix units yes (amx_bf16, avx512_bf16), mixed_precision=no" in caplog.text
    assert "bf16=true would put the matmuls on them" in caplog.text


def test_another_device_has_none_detected():
    assert not hardware.has_bf16_matrix_units("meta")
