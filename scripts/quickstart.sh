#!/usr/bin/env bash
# The main job: set up, then serve SmolLM2-135M-Instruct through stock vLLM with freespec's
# recommended plugin (`hybrid`), with plain vLLM and with vLLM's own `suffix` (stock vLLM's best method
# at one request on 2 cores: 1.32x against ngram's 1.15x, results/load-bfloat16-zen4) at concurrency 1,
# one prompt of each of six categories, and print the speed-up table. Every server gets the same engine
# settings (torch.compile'd, as vLLM runs by default); the servers after the first reuse its compiled
# kernels (freespec bench, server.py). 9 min 17 s on 2 cores from a fresh clone with a warm pip cache and
# a cold compile cache, setup included (results/ci-cost/results.md). Add ngram with
# `--configs none,ngram,suffix,hybrid`, more prompts with `--per-category 2`. Questions: Spec-Bench
# when it is given, cached or can be downloaded, else freespec's built-in prompt set (the output says
# which). The dtype fits the CPU (bfloat16 only where it is native). Extra arguments go to
# `freespec bench` and win.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/freespec bench \
  --configs none,suffix,hybrid \
  --categories writing,coding,summarization,rag,translation,math_reasoning \
  --per-category 1 --max-tokens 128 --warmup 1 --concurrency 1 "$@"
