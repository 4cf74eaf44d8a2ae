#!/usr/bin/env bash
# Shared cores (docs/performance.md): the default recipe's s/step alone and with a second job on the same
# cores, with the thread policy (torch_num_threads unset) and without it (torch_num_threads=0: torch's default
# of one thread per core). Median s/step over steps 6-30 of each run. The machine must be otherwise idle.
#   bash benchmarks/shared_cores.sh
set -euo pipefail
out=$(mktemp -d)
run() {  # run NAME [grpokit train args...]
  local name=$1; shift
  grpokit train max_steps=30 evaluate=false disable_tqdm=true overwrite_output_dir=true \
    output_dir="$out/$name" "$@" > "$out/$name.log" 2>&1
  python - "$out/$name" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1] + "/metrics.jsonl")]
print(f"{sys.argv[1].rsplit('/', 1)[1]:<32} median s/step {statistics.median(r['time/step'] for r in rows[5:]):.3f}")
PY
}
busy() {  # a foreign 2-thread PyTorch job: 256x256 matmuls for $1 seconds
  python -c "
import sys, time, torch
a = torch.randn(256, 256); t = time.time(); n = 0
while time.time() - t < $1: a @ a; n += 1
print(f'foreign job: {n / $1:.0f} matmuls/s')"
}
run alone-policy
run alone-torch-default torch_num_threads=0
run pair-policy-1 & run pair-policy-2 & wait
run pair-torch-default-1 torch_num_threads=0 & run pair-torch-default-2 torch_num_threads=0 & wait
busy 8
(busy 25 & sleep 2; run with-foreign-policy; wait)
(busy 25 & sleep 2; run with-foreign-torch-default torch_num_threads=0; wait)
