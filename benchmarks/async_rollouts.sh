#!/usr/bin/env bash
# Asynchronous rollouts (docs/generation.md): median s/step of a recipe's steps 6-N, synchronous against
# async_generation with max_staleness 1 (generation in a background thread from a frozen copy), run one after
# the other on an otherwise idle machine. Default: the default recipe (tiny arithmetic), 40 steps.
#   bash benchmarks/async_rollouts.sh [RECIPE] [STEPS]
set -euo pipefail
recipe=${1:-recipes/arithmetic-tiny.yaml}
steps=${2:-40}
out=$(mktemp -d)
run() {  # run NAME [grpokit train args...]
  local name=$1; shift
  grpokit train "$recipe" max_steps="$steps" evaluate=false disable_tqdm=true overwrite_output_dir=true \
    output_dir="$out/$name" "$@" > "$out/$name.log" 2>&1
  python - "$out/$name" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1] + "/metrics.jsonl")][5:]
med = lambda key: statistics.median(r.get(key, 0.0) for r in rows)
print(f"{sys.argv[1].rsplit('/', 1)[1]:<8} median s/step {med('time/step'):.3f}  generate(+wait) "
      f"{med('time/generate') + med('time/generate_wait'):.3f}  update {med('time/update'):.3f}  "
      f"background generate {med('time/async/generate'):.3f}  reward {rows[-1]['reward']:.3f}")
PY
}
run sync
run async async_generation=true max_staleness=1
