#!/usr/bin/env bash
# The main job: set up, then serve SmolLM2-135M-Instruct through stock vLLM with freespec's
# recommended plugin (`hybrid`) and with plain vLLM (and vLLM's own ngram and suffix) at concurrency 1,
# and print the speed-up table. Questions: Spec-Bench when it is given, cached or can be downloaded,
# else freespec's built-in prompt set (the output says which). The dtype fits the CPU (bfloat16 only
# where it is native). Extra arguments go to `freespec bench` and win.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/freespec bench \
  --configs none,ngram,suffix,hybrid \
  --categories writing,coding,summarization,rag,translation,math_reasoning \
  --per-category 2 --max-tokens 128 --concurrency 1 "$@"
