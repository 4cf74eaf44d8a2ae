#!/usr/bin/env bash
# The vLLM backend on one GPU (docs/generation.md, "The vLLM backend"): colocate generation against the fast
# sampler (greedy and in distribution), one GRPOTrainer step with weights synced into the engine (plain and
# LoRA) and the importance-sampling metrics logged, then server mode (`vllm serve` as `trl vllm-serve` runs
# it; its NCCL weight sync needs a second GPU, else it is skipped with a message). Needs vllm and peft.
# Each part runs in its own process (one engine each), at most 7 minutes including the engine's start-up;
# the whole check should take a few minutes. Not yet run on a GPU.
# The exit status is the number of parts that failed.
set -uo pipefail
cd "$(dirname "$0")/../.."

if ! python -c "import vllm" 2>/dev/null; then
    echo "SKIP  vllm is not installed (pip install 'grpokit[vllm]')"
    exit 0
fi

failed=0
for part in sampling train train-lora server; do
    echo "== ${part}"
    if ! timeout 420 python benchmarks/gpu/vllm_check.py "${part}"; then
        echo "FAIL  part ${part} (exit status above, or timed out after 420 s)"
        failed=$((failed + 1))
    fi
done
echo "== vllm_check: ${failed} part(s) failed"
exit "${failed}"
