"""bf16 matrix-unit detection (``grpokit.parallel.hardware``): flags read as /proc/cpuinfo states them, and
the answer for each kind of processor."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from grpokit import GRPOConfig
from grpokit.models.cpu_linear import cpu_family
from grpokit.parallel import hardware


def test_cpu_flags_are_those_of_proc_cpuinfo(monkeypatch):
    monkeypatch.delenv(hardware.MATRIX_UNITS_ENV, raising=False)  # the suite states "none" (conftest)
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


def test_cpu_family_is_that_of_proc_cpuinfo():
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo")
    pairs = (line.split(":", 1) for line in cpuinfo.read_text().splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in pairs}  # every processor states the same
    vendor, family = fields.get("vendor_id"), fields.get("cpu family")
    assert cpu_family() == ((vendor, int(family)) if vendor and family else None)


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
    monkeypatch.delenv(hardware.MATRIX_UNITS_ENV, raising=False)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(hardware.platform, "machine", lambda: machine)
    assert hardware.has_bf16_matrix_units("cpu") is units
    assert hardware.has_bf16_matrix_units() is units  # None: the CPU


def test_the_trainer_start_logs_it(monkeypatch, caplog):
    monkeypatch.delenv(hardware.MATRIX_UNITS_ENV, raising=False)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"amx_bf16", "avx512_bf16"}))
    with caplog.at_level(logging.INFO, logger="grpokit.parallel.hardware"):
        support = hardware.log_bf16_support("cpu", "no")
    assert support.matrix_units
    assert "cpu: bf16 matrix units yes (amx_bf16, avx512_bf16), mixed_precision=no" in caplog.text
    assert "bf16=true would put the matmuls on them" in caplog.text


def test_another_device_has_none_detected():
    assert not hardware.has_bf16_matrix_units("meta")


def test_the_environment_variable_states_the_answer(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"amx_bf16", "avx512_bf16"}))
    monkeypatch.setenv(hardware.MATRIX_UNITS_ENV, "0")
    support = hardware.bf16_support("cpu")
    assert not support.matrix_units
    assert support.features == ("amx_bf16", "avx512_bf16", "GRPOKIT_BF16_MATRIX_UNITS=0")
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset())
    monkeypatch.setenv(hardware.MATRIX_UNITS_ENV, "1")
    assert hardware.has_bf16_matrix_units()
    monkeypatch.setenv(hardware.MATRIX_UNITS_ENV, "yes")
    with pytest.raises(ValueError, match="GRPOKIT_BF16_MATRIX_UNITS='yes': set it to 1"):
        hardware.bf16_support("cpu")


@pytest.mark.parametrize(
    ("flags", "accelerator", "use_cpu", "expected"),
    [
        ({"amx_bf16", "amx_tile"}, None, False, "bf16"),  # AMX, a CPU run
        ({"avx512_bf16"}, None, False, "no"),  # a dot-product instruction only: fp32
        ({"avx2"}, None, True, "no"),
        ({"amx_bf16", "amx_tile"}, "cuda", False, "no"),  # the run is on the GPU: fp32 unless bf16=true
        ({"amx_bf16", "amx_tile"}, "cuda", True, "bf16"),  # use_cpu: the CPU's answer
    ],
)
def test_the_default_precision_follows_the_processor(monkeypatch, flags, accelerator, use_cpu, expected):
    monkeypatch.delenv(hardware.MATRIX_UNITS_ENV, raising=False)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(hardware.platform, "machine", lambda: "x86_64")
    device = None if accelerator is None else torch.device(accelerator)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: device)
    assert hardware.default_mixed_precision(use_cpu) == expected
    processor = hardware.default_mixed_precision(use_cpu)
    config = GRPOConfig(use_cpu=use_cpu)
    assert config.bf16 is None and config.resolved(processor).mixed_precision == expected
    assert config.resolved(processor).bf16 is (expected == "bf16")
    # anything the config states wins over the processor
    assert GRPOConfig(use_cpu=use_cpu, bf16=False).resolved(processor).mixed_precision == "no"
    assert GRPOConfig(use_cpu=use_cpu, fp16=True).resolved(processor).mixed_precision == "fp16"
    assert GRPOConfig(use_cpu=use_cpu, mixed_precision="fp16").resolved(processor).mixed_precision == "fp16"
    assert GRPOConfig(use_cpu=use_cpu, bf16=True).resolved(processor).mixed_precision == "bf16"


def test_the_start_says_when_the_processor_chose_bf16(monkeypatch, caplog):
    monkeypatch.setenv(hardware.MATRIX_UNITS_ENV, "1")
    with caplog.at_level(logging.INFO, logger="grpokit.parallel.hardware"):
        hardware.log_bf16_support("cpu", "bf16", by_default=True)
    assert "mixed_precision=bf16 (the default on this processor; bf16=false computes in fp32)" in caplog.text
