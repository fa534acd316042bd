#!/usr/bin/env bash
# The main job: set up, then serve SmolLM2-135M-Instruct through stock vLLM with freespec's
# `copy` proposer and with plain vLLM (and vLLM's own ngram and suffix), on a few Spec-Bench
# questions, and print the speed-up table. Extra arguments go to `freespec bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# bfloat16 is fast only where the CPU has it natively; elsewhere (like the 2-core machines this project is
# developed on) vLLM emulates it and float32 is several times faster.
dtype=bfloat16
grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null || dtype=float32
exec .venv/bin/freespec bench --dtype "$dtype" \
  --configs none,ngram,suffix,copy \
  --categories writing,coding,summarization,rag,translation,math_reasoning \
  --per-category 2 --max-tokens 128 --concurrency 1 "$@"
