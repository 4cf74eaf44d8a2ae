#!/usr/bin/env bash
# Run HERE (a machine with network), before the checkout travels to the GPU machine, which has no network.
# Downloads into benchmarks/gpu/wheels/ (git-ignored; carry it with the checkout) the pure-Python wheels, for
# Python 3.12, of what grpokit needs that the GPU machine lacks. The GPU machine has torch, transformers,
# accelerate, peft, safetensors, tokenizers, numpy, pyyaml, tqdm, matplotlib, pytest (and their
# dependencies); it lacks tyro and math-verify (grpokit imports both), and setuptools >= 77, which
# pyproject.toml's build needs to install grpokit. `datasets` is not shipped: grpokit imports it only
# where a run reads a data file, a folder, a Hub data set or a `datasets.Dataset` (data/sources.py), never
# on the path check.py runs, and it would bring pyarrow and pandas (~60 MiB of binaries). deepspeed and vllm
# are optional extras check.py does not use. The wheels are what pip resolves, so their dependencies are
# there too (sympy, typing_extensions...: the GPU machine has its own; check.sh takes from the folder only
# what is missing). About 8.5 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=benchmarks/gpu/wheels
PYTHON=${PYTHON:-python3}
rm -rf "$WHEELS"
mkdir -p "$WHEELS"
"$PYTHON" -m pip download --quiet --dest "$WHEELS" --only-binary=:all: --python-version 3.12 \
    --implementation cp --abi cp312 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    "tyro>=0.8" "math-verify>=0.7" "setuptools>=77" "wheel"
# check.sh installs these names (with whatever of their dependencies the machine lacks) from the folder
printf '%s\n' "tyro>=0.8" "math-verify>=0.7" > "$WHEELS/requirements.txt"
for wheel in "$WHEELS"/*; do
    case "$wheel" in
        *-none-any.whl | */requirements.txt) ;;
        *) echo "prepare.sh: $wheel is not a pure-Python wheel" >&2; exit 1 ;;
    esac
done
ls -1 "$WHEELS"
du -sh "$WHEELS"
echo "Carry $WHEELS with the checkout (it is git-ignored), then on the GPU machine: bash benchmarks/gpu/check.sh"
