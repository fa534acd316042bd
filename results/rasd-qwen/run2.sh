#!/usr/bin/env bash
# Second run (after commit 445123b: hybrid's own time left out of the policy's step-time fit): none, retrieval
# alone, and hybrid with the datastore with and without the draft model; otherwise as run.sh.
# Usage: bash results/rasd-qwen/run2.sh QUESTIONS OUT
set -euo pipefail
Q=$1 OUT=$2
M=~/.cache/freespec/models/qwen2.5-coder-1.5b-instruct
D=~/.cache/freespec/models/qwen2.5-coder-0.5b-instruct
S=~/.cache/freespec/datastores/sharegpt-stdlib-qwen2.5-coder-1.5b-instruct
FREESPEC_STATS_INTERVAL_S=2 VLLM_CPU_KVCACHE_SPACE=2 .venv/bin/freespec bench --questions "$Q" \
  --model "$M" --dtype float32 --num-speculative-tokens 4 \
  --configs none "retrieval:{\"datastore\":\"$S\"}" \
  "hybrid:{\"datastore\":\"$S\",\"draft_model\":\"$D\",\"draft\":{\"draft_cores\":\"1\"}}" \
  "hybrid:{\"datastore\":\"$S\"}" \
  --per-category 1 --concurrency 1 --max-tokens 64 --warmup 1 --reuse-server --out "$OUT"
