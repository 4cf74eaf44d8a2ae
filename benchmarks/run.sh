#!/usr/bin/env bash
# grpokit vs TRL, side by side, one command:  bash benchmarks/run.sh [bench_grpo.py options]
#
# Creates benchmarks/.venv-trl (git-ignored) with TRL on first use. TRL is never a grpokit dependency: it
# lives only in that environment. torch is pinned to the grpokit environment's version so pip reuses the
# local CPU wheel instead of resolving a new (CUDA) torch.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
GRPOKIT_PYTHON="${GRPOKIT_PYTHON:-}"
if [ -z "$GRPOKIT_PYTHON" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then GRPOKIT_PYTHON="$ROOT/.venv/bin/python"; else GRPOKIT_PYTHON="python3"; fi
fi
TRL_VENV="$HERE/.venv-trl"
if [ ! -x "$TRL_VENV/bin/python" ] || ! "$TRL_VENV/bin/python" -c "import trl" 2>/dev/null; then
    echo "creating $TRL_VENV (torch==$TORCH_VERSION + trl) ..."
    python3 -m venv "$TRL_VENV"
    "$TRL_VENV/bin/pip" install --quiet --disable-pip-version-check "torch==$TORCH_VERSION" trl
fi
"$GRPOKIT_PYTHON" -c "import grpokit" 2>/dev/null || {
    echo "grpokit is not importable by $GRPOKIT_PYTHON: pip install -e . first (or set GRPOKIT_PYTHON)" >&2
    exit 1
}
exec "$GRPOKIT_PYTHON" "$HERE/bench_grpo.py" --trl-python "$TRL_VENV/bin/python" "$@"
