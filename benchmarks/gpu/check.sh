#!/usr/bin/env bash
# One-GPU check of the real-model path (bf16, gradient checkpointing, LoRA, both samplers, reference offload,
# peak memory against `grpokit plan`). Needs the test extra (peft). One short call, about 1-2 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
python benchmarks/gpu/check.py --device cuda "$@"
