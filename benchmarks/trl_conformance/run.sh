#!/usr/bin/env bash
# TRL's own GRPO tests on TRL and on grpokit, one command (see README.md):
#
#   bash benchmarks/trl_conformance/run.sh [-k EXPR | --subset EXPR] [--timeout S] [--reuse] [--only trl|grpokit] [-- PYTEST_ARGS]
#
# Prepares what is missing, then runs the test file on each side and prints
# "TRL: N passed; grpokit: M passed" and grpokit's failures grouped by cause; writes
# benchmarks/results/trl_conformance-<date>.{json,md}. Setup (first run only) needs the package index and
# TRL's test files (get_trl_tests.sh); the tests themselves run offline against local stand-ins.
#   1. benchmarks/.venv-trl: torch==$TORCH_VERSION (the CPU wheel grpokit's environment uses) + trl==$TRL_VERSION
#      (+ torchvision==$TORCHVISION_VERSION when set: the vision-language tests, see README.md)
#   2. .deps/trl-side, .deps/grpokit-side: test-only packages installed with pip --target --no-deps, on
#      PYTHONPATH for that side only (neither environment is modified): pytest, pytest-timeout, peft, Pillow,
#      jmespath for TRL's environment (which has none of them); for grpokit's, pytest-timeout, jmespath and
#      trl==$TRL_VERSION itself (TRL's test helpers import trl.import_utils, trl.trainer.base_config)
#   3. vendor/: TRL's test files at the pinned commit (get_trl_tests.sh)
#   4. .hf_home/: the stand-in models and data sets (standins.py, run with TRL's Python)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
# Set (e.g. 0.29.1 with TORCH_VERSION=2.14.1) for the vision-language tests: their processors need torchvision.
TORCHVISION_VERSION="${TORCHVISION_VERSION:-}"
TRL_VERSION="${TRL_VERSION:-1.16.0}"
GRPOKIT_PYTHON="${GRPOKIT_PYTHON:-}"
if [ -z "$GRPOKIT_PYTHON" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then GRPOKIT_PYTHON="$ROOT/.venv/bin/python"; else GRPOKIT_PYTHON="python3"; fi
fi
TRL_VENV="${TRL_VENV:-$ROOT/benchmarks/.venv-trl}"
TRL_PYTHON="$TRL_VENV/bin/python"

args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --subset) args+=(-k "$2"); shift 2 ;;
        *) args+=("$1"); shift ;;
    esac
done

"$GRPOKIT_PYTHON" -c "import grpokit" 2>/dev/null || {
    echo "grpokit is not importable by $GRPOKIT_PYTHON: pip install -e . first (or set GRPOKIT_PYTHON)" >&2
    exit 1
}

# 1. TRL's environment
if [ ! -x "$TRL_PYTHON" ] || ! "$TRL_PYTHON" -c "import trl" 2>/dev/null; then
    echo "creating $TRL_VENV (torch==$TORCH_VERSION${TORCHVISION_VERSION:+ + torchvision==$TORCHVISION_VERSION} + trl==$TRL_VERSION) ..."
    python3 -m venv "$TRL_VENV"
    "$TRL_VENV/bin/pip" install --quiet --disable-pip-version-check "torch==$TORCH_VERSION" \
        ${TORCHVISION_VERSION:+"torchvision==$TORCHVISION_VERSION"} "trl==$TRL_VERSION"
elif [ -n "$TORCHVISION_VERSION" ] && ! "$TRL_PYTHON" -c "import torchvision" 2>/dev/null; then
    echo "adding torchvision==$TORCHVISION_VERSION to $TRL_VENV ..."
    "$TRL_VENV/bin/pip" install --quiet --disable-pip-version-check "torch==$TORCH_VERSION" \
        "torchvision==$TORCHVISION_VERSION"
fi
installed_trl="$("$TRL_PYTHON" -c "import trl; print(trl.__version__)")"
tf_trl="$("$TRL_PYTHON" -c "import transformers; print(transformers.__version__)")"
tf_grpokit="$("$GRPOKIT_PYTHON" -c "import transformers; print(transformers.__version__)")"
if [ "$tf_trl" != "$tf_grpokit" ]; then
    echo "warning: transformers $tf_trl on TRL's side, $tf_grpokit on grpokit's (pin them equal)" >&2
fi
if [ "$installed_trl" != "$TRL_VERSION" ]; then
    echo "warning: $TRL_VENV has trl $installed_trl, not $TRL_VERSION; the results record the version used" >&2
fi

# 2. test-only packages, per side, outside both environments
install_deps() {  # install_deps SIDE PYTHON REQUIREMENT...
    local side="$1" python="$2"
    shift 2
    local dir="$HERE/.deps/$side" want="$*"
    if [ -f "$dir/.requirements" ] && [ "$(cat "$dir/.requirements")" = "$want" ]; then
        return
    fi
    echo "installing into .deps/$side: $want"
    rm -rf "$dir"
    "$python" -m pip install --quiet --disable-pip-version-check --no-deps --target "$dir" "$@"
    echo "$want" >"$dir/.requirements"
}
install_deps trl-side "$TRL_PYTHON" pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 Pygments==2.21.0 \
    pytest-timeout==2.4.0 peft==0.21.2 pillow==12.3.0 jmespath==1.0.1
install_deps grpokit-side "$GRPOKIT_PYTHON" "trl==$installed_trl" pytest-timeout==2.4.0 jmespath==1.0.1

# 3. TRL's test files
bash "$HERE/get_trl_tests.sh"

# 4. stand-ins
"$TRL_PYTHON" "$HERE/standins.py"

# run, compare, report
exec "$GRPOKIT_PYTHON" "$HERE/harness.py" --trl-python "$TRL_PYTHON" --grpokit-python "$GRPOKIT_PYTHON" "${args[@]}"
