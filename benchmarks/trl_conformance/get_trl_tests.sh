#!/usr/bin/env bash
# Puts TRL's GRPO test file (and the conftest/testing_utils it imports) at the commit pinned in
# trl_tests.lock into vendor/ (git-ignored), checking each file's sha256:
#   vendor/trl_tests/      the files verbatim (run on TRL)
#   vendor/grpokit_tests/  the same files; in test_grpo_trainer.py the one line
#                          `from trl import GRPOConfig, GRPOTrainer` reads `from grpokit import ...` (run on grpokit)
# Source, first that works: $TRL_REPO (a local clone of TRL, bare or not, that has the commit), else
# raw.githubusercontent.com (network, once; nothing is downloaded when vendor/ is already complete).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
LOCK="$HERE/trl_tests.lock"
VENDOR="$HERE/vendor"
COMMIT="$(awk '$1 == "commit" {print $2}' "$LOCK")"
FILES="$(awk 'length($1) == 64 {print $2}' "$LOCK")"

check() {  # check DIR: every locked file present with its hash
    local dir="$1" f want got
    for f in $FILES; do
        want="$(awk -v p="$f" '$2 == p {print $1}' "$LOCK")"
        [ -f "$dir/$(basename "$f")" ] || return 1
        got="$(sha256sum "$dir/$(basename "$f")" | cut -d' ' -f1)"
        [ "$got" = "$want" ] || { echo "sha256 mismatch for $f ($got, lock says $want)" >&2; return 1; }
    done
}

if [ -d "$VENDOR/trl_tests" ] && check "$VENDOR/trl_tests" 2>/dev/null && [ -f "$VENDOR/grpokit_tests/test_grpo_trainer.py" ]; then
    exit 0
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
got_all=0
if [ -n "${TRL_REPO:-}" ]; then
    echo "TRL tests: reading commit $COMMIT from $TRL_REPO"
    gitdir="$TRL_REPO"
    [ -d "$TRL_REPO/.git" ] && gitdir="$TRL_REPO/.git"
    got_all=1
    for f in $FILES; do
        git --git-dir="$gitdir" show "$COMMIT:$f" >"$TMP/$(basename "$f")" || { got_all=0; break; }
    done
fi
if [ "$got_all" = 0 ]; then
    echo "TRL tests: downloading commit $COMMIT from raw.githubusercontent.com"
    got_all=1
    for f in $FILES; do
        curl -fsSL --max-time 60 "https://raw.githubusercontent.com/huggingface/trl/$COMMIT/$f" \
            -o "$TMP/$(basename "$f")" || { got_all=0; break; }
    done
fi
if [ "$got_all" = 0 ]; then
    echo "could not get TRL's test files at $COMMIT: set TRL_REPO to a local clone of" >&2
    echo "https://github.com/huggingface/trl that has that commit, or allow access to raw.githubusercontent.com" >&2
    exit 1
fi
check "$TMP"

rm -rf "$VENDOR"
mkdir -p "$VENDOR/trl_tests" "$VENDOR/grpokit_tests"
for f in $FILES; do
    cp "$TMP/$(basename "$f")" "$VENDOR/trl_tests/"
    cp "$TMP/$(basename "$f")" "$VENDOR/grpokit_tests/"
done
sed -i 's/^from trl import GRPOConfig, GRPOTrainer$/from grpokit import GRPOConfig, GRPOTrainer/' \
    "$VENDOR/grpokit_tests/test_grpo_trainer.py"
changed="$(diff "$VENDOR/trl_tests/test_grpo_trainer.py" "$VENDOR/grpokit_tests/test_grpo_trainer.py" | grep -c '^>' || true)"
if [ "$changed" != 1 ]; then
    echo "expected exactly one changed import line in the grpokit copy, got $changed" >&2
    exit 1
fi
echo "TRL tests at $COMMIT in $VENDOR (grpokit copy: 1 import line changed)"
