#!/usr/bin/env bash
# One-GPU check of the real-model path, on a GPU machine without network (benchmarks/gpu/check.py says what
# it checks): bf16 lr-0 invariants, gradient checkpointing, LoRA with the fast sampler, both samplers, the
# reference offload, a GRPO run on a Qwen2.5-0.5B-shaped model with its peak memory against `grpokit plan`,
# padding-free passes, the lean layers, and tokens/s. One command, about 2-3 minutes on an H200 (estimate; not yet run on a GPU); check.py is
# stopped at GPU_CHECK_TIMEOUT_S (default 480 s), so the whole command ends within 9 minutes.
#
# First, on a machine with network: bash benchmarks/gpu/prepare.sh (the wheels of what the GPU machine
# lacks, into the git-ignored benchmarks/gpu/wheels/, which must travel with the checkout). Here, the
# machine's own torch/transformers/accelerate/peft are used: grpokit is installed without its dependencies,
# and only what is missing is installed, from that folder (--no-index: pip never looks at the network).
# Exit status: 0 when every check passed; non-zero on any failure (a failed install, a failed check, the
# time limit). Extra arguments go to check.py (e.g. --quick, --only half_billion_run).
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=benchmarks/gpu/wheels
if [ -z "${PYTHON:-}" ]; then  # the interpreter that has torch (python, else python3)
    for candidate in python python3; do
        if command -v "$candidate" >/dev/null && "$candidate" -c "import torch" 2>/dev/null; then
            PYTHON=$candidate
            break
        fi
    done
fi
if [ -z "${PYTHON:-}" ]; then
    echo "check.sh: no python with torch on PATH (set PYTHON=...)" >&2
    exit 2
fi
if [ ! -f "$WHEELS/requirements.txt" ]; then
    echo "check.sh: $WHEELS/ is missing: run bash benchmarks/gpu/prepare.sh on a machine with network" \
        "and carry that folder with the checkout (it is git-ignored)" >&2
    exit 2
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_BREAK_SYSTEM_PACKAGES=1
# tyro and math-verify, and whichever of their dependencies this machine lacks (those it has are kept)
"$PYTHON" -m pip install --quiet --no-index --find-links "$WHEELS" -r "$WHEELS/requirements.txt"
# grpokit itself, none of its dependencies (datasets is not shipped: check.py never imports it); the build's
# setuptools>=77 comes from the folder too
"$PYTHON" -m pip install --quiet --no-index --find-links "$WHEELS" --no-deps -e .
"$PYTHON" -c "import grpokit, grpokit.cli, tyro, math_verify; print('grpokit', grpokit.__version__, 'imports')"
status=0
timeout --kill-after=15 "${GPU_CHECK_TIMEOUT_S:-480}" "$PYTHON" benchmarks/gpu/check.py --device cuda "$@" \
    || status=$?
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo "check.sh: check.py stopped after ${GPU_CHECK_TIMEOUT_S:-480} s" >&2
fi
exit "$status"
