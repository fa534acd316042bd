#!/usr/bin/env bash
# The main job: set up, then serve SmolLM2-135M-Instruct through stock vLLM with freespec's
# `copy` proposer and with plain vLLM (and vLLM's own ngram and suffix), on a few Spec-Bench
# questions, and print the speed-up table. Extra arguments go to `freespec bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/freespec bench \
  --configs none,ngram,suffix,copy \
  --categories writing,coding,summarization,rag,translation,math_reasoning \
  --per-category 2 --max-tokens 128 --concurrency 1 "$@"
