#!/usr/bin/env bash
# RASD on the Qwen2.5-Coder 1.5B/0.5B pair (issue 16): the default hybrid with the draft model and the
# corpus datastore as sources, against pearl alone, retrieval alone and vLLM's draft_model; one question per
# Spec-Bench category at concurrency 1, 64 tokens, K = 4, float32. Needs both models prepared
# (freespec models prepare ...) and the Qwen corpus datastore (bash scripts/corpus_datastore.sh
# qwen2.5-coder-1.5b-instruct QUESTIONS). Usage: bash results/rasd-qwen/run.sh QUESTIONS OUT
set -euo pipefail
Q=$1 OUT=$2
M=~/.cache/freespec/models/qwen2.5-coder-1.5b-instruct
D=~/.cache/freespec/models/qwen2.5-coder-0.5b-instruct
S=~/.cache/freespec/datastores/sharegpt-stdlib-qwen2.5-coder-1.5b-instruct
FREESPEC_STATS_INTERVAL_S=2 VLLM_CPU_KVCACHE_SPACE=2 .venv/bin/freespec bench --questions "$Q" \
  --model "$M" --dtype float32 --num-speculative-tokens 4 \
  --configs none "pearl:{\"draft_model\":\"$D\",\"draft_cores\":\"1\"}" \
  "retrieval:{\"datastore\":\"$S\"}" \
  "hybrid:{\"datastore\":\"$S\",\"draft_model\":\"$D\",\"draft\":{\"draft_cores\":\"1\"}}" \
  "draft_model:{\"model\":\"$D\"}" \
  --per-category 1 --concurrency 1 --max-tokens 64 --warmup 1 --reuse-server --out "$OUT"
