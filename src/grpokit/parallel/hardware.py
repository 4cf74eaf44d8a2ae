"""What the processor offers for low-precision matrix products: bf16 matrix units, and the instructions below
them. One home for the question; the trainer logs the answer at start, ``benchmarks/roofline.py`` prints it
beside its measured rates.

- **x86 CPUs.** ``amx_bf16`` (Intel AMX, Sapphire Rapids and later): tile units that multiply bf16 matrices
  several times faster than fp32 FMAs. ``avx512_bf16`` (Cooper Lake, AMD Zen 4 and later): a bf16 dot-product
  vector instruction, about twice fp32's rate at best; no matrix unit. Read from ``/proc/cpuinfo``'s flags
  (torch 2.13 exposes the AMX tile check only inside its own kernels).
- **Arm CPUs.** ``bf16`` in ``/proc/cpuinfo``'s features (Armv8.6 BF16: ``BFMMLA``, a 2x4 by 4x2 bf16
  matrix multiply-accumulate per instruction, and ``BFDOT``): matrix instructions, counted as matrix units.
- **CUDA GPUs.** Compute capability 8.0 (Ampere) and later: bf16 tensor cores. ROCm: what torch reports
  without emulation.

``default_mixed_precision`` is the one default that follows from the answer: a CPU run that sets no precision
(``bf16`` unset) computes in bf16 on a CPU with bf16 matrix units, in fp32 elsewhere (the measurements
behind it: docs/performance.md). ``GRPOKIT_BF16_MATRIX_UNITS=0`` / ``=1`` states the answer for the CPU
instead of ``/proc/cpuinfo`` (a virtual machine that hides its flags; a test suite that must give the same
numbers on every machine).
"""

from __future__ import annotations

import logging
import os
import platform
from dataclasses import dataclass

import torch

from grpokit.models.cpu_linear import cpuinfo

__all__ = [
    "MATRIX_UNITS_ENV",
    "Bf16Support",
    "bf16_support",
    "cpu_flags",
    "default_mixed_precision",
    "has_bf16_matrix_units",
    "log_bf16_support",
]

logger = logging.getLogger(__name__)

CPU_FEATURES = ("amx_bf16", "amx_tile", "amx_fp16", "avx512_bf16", "avx512_fp16", "bf16")
"""The ``/proc/cpuinfo`` flags reported: x86's AMX and AVX-512 half-precision extensions, Arm's ``bf16``."""

MATRIX_UNITS_ENV = "GRPOKIT_BF16_MATRIX_UNITS"
"""Environment variable: ``1`` or ``0`` states whether the CPU has bf16 matrix units (unset: its flags
say)."""


@dataclass(frozen=True)
class Bf16Support:
    """The answer for one device."""

    device: str
    """``cpu``, ``cuda:0``, ..."""
    matrix_units: bool
    """bf16 matrix products run on dedicated matrix hardware (AMX, Arm BF16 ``BFMMLA``, tensor cores)."""
    features: tuple[str, ...]
    """The processor features found that bear on it (``amx_bf16``, ``avx512_bf16``, ``sm_90``, ...)."""

    def describe(self) -> str:
        """One line for a log."""
        found = ", ".join(self.features) or "no bf16 feature found"
        answer = "yes" if self.matrix_units else "no"
        return f"{self.device}: bf16 matrix units {answer} ({found})"


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (x86 ``flags``, Arm ``Features``); empty where there
    is no such file (macOS, Windows)."""
    fields = cpuinfo()
    return frozenset(fields.get("flags", fields.get("Features", "")).split())


def bf16_support(device: torch.device | str | None = None) -> Bf16Support:
    """bf16 matrix support of ``device`` (None: the CPU)."""
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        name = f"cuda:{index}"
        if torch.version.hip is not None:
            units = torch.cuda.is_bf16_supported(including_emulation=False)
            return Bf16Support(name, units, (torch.cuda.get_device_name(index),))
        major, minor = torch.cuda.get_device_capability(index)
        return Bf16Support(name, (major, minor) >= (8, 0), (f"sm_{major}{minor}",))
    if device.type != "cpu":
        return Bf16Support(str(device), False, ())
    flags = cpu_flags()
    features = tuple(flag for flag in CPU_FEATURES if flag in flags)
    stated = os.environ.get(MATRIX_UNITS_ENV)
    if stated is not None:
        if stated not in ("0", "1"):
            raise ValueError(
                f"{MATRIX_UNITS_ENV}={stated!r}: set it to 1 (the CPU has bf16 matrix units) or 0 "
                "(it has none)"
            )
        return Bf16Support("cpu", stated == "1", (*features, f"{MATRIX_UNITS_ENV}={stated}"))
    arm = platform.machine().lower() in ("aarch64", "arm64")
    units = "amx_bf16" in flags or (arm and "bf16" in flags)
    return Bf16Support("cpu", units, features)


def has_bf16_matrix_units(device: torch.device | str | None = None) -> bool:
    """Whether ``device`` (None: the CPU) multiplies bf16 matrices on matrix hardware: AMX-BF16 or Arm BF16
    on CPUs, tensor cores (compute capability >= 8.0) on CUDA GPUs."""
    return bf16_support(device).matrix_units


def default_mixed_precision(use_cpu: bool) -> str:
    """The mixed precision of a run that chooses none (``bf16`` unset, no ``fp16``, ``mixed_precision="no"``):
    ``"bf16"`` when the run computes on the CPU (``use_cpu``, or torch sees no accelerator) and the CPU has
    bf16 matrix units; ``"no"`` (fp32) elsewhere, GPUs included (set ``bf16=true`` there, as TRL's examples
    do). bf16 autocast learned as well as fp32 over 3 seeds on every recipe compared, and on such CPUs bf16
    matrix products run several times faster than fp32's (docs/performance.md)."""
    on_cpu = use_cpu or torch.accelerator.current_accelerator() is None
    return "bf16" if on_cpu and has_bf16_matrix_units("cpu") else "no"


def log_bf16_support(
    device: torch.device | str, mixed_precision: str, by_default: bool = False
) -> Bf16Support:
    """Log what ``device`` offers for bf16 and whether the run computes in it (``mixed_precision``;
    ``by_default``: chosen by ``default_mixed_precision``, not by the config)."""
    support = bf16_support(device)
    if by_default and mixed_precision == "bf16":
        advice = " (the default on this processor; bf16=false computes in fp32)"
    elif support.matrix_units and mixed_precision == "no":
        advice = "; this run computes in fp32 (bf16=true would put the matmuls on them)"
    elif not support.matrix_units and mixed_precision == "bf16":
        advice = "; bf16 autocast without matrix units (benchmarks/roofline.py --precision bf16 measures it)"
    else:
        advice = ""
    logger.info("grpokit: %s, mixed_precision=%s%s", support.describe(), mixed_precision, advice)
    return support
