#!/usr/bin/env bash
# The vLLM backend on one GPU (docs/generation.md, "The vLLM backend"): colocate generation against the fast
# sampler (greedy and in distribution); two GRPOTrainer steps with the weights pushed once per step, the
# importance-sampling metrics checked by value at temperature 0.7 (plain, and LoRA with sleep mode level 2,
# whose freed memory and wake + push cost are measured against level 1); then server mode (`vllm serve` as
# `trl vllm-serve` runs it; its NCCL weight sync needs a second GPU, else it is skipped with a message).
# Needs vllm, peft and a CUDA GPU: without them it fails (nothing checked is not a pass). One command of at
# most 10 minutes: each part runs in its own process (one engine each) under its own time limit.
# The exit status is the number of parts that failed.
set -uo pipefail
cd "$(dirname "$0")/../.."

if ! python -c "import vllm" 2>/dev/null; then
    echo "FAIL  vllm is not installed (pip install 'grpokit[vllm]'): nothing was checked"
    exit 1
fi

failed=0
for part in sampling:120 train:150 train-lora:170 server:150; do
    name=${part%%:*}
    limit=${part##*:}
    echo "== ${name} (at most ${limit} s)"
    if ! timeout "${limit}" python benchmarks/gpu/vllm_check.py "${name}"; then
        echo "FAIL  part ${name} (exit status above, or timed out after ${limit} s)"
        failed=$((failed + 1))
    fi
done
echo "== vllm_check: ${failed} part(s) failed"
exit "${failed}"
