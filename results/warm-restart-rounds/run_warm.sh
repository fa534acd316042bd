#!/usr/bin/env bash
# Warm restart against cold start, two rounds on fresh questions (B: 3rd question of each category, B2: 4th).
set -euo pipefail
cd "$(dirname "$0")/../.."
for r in 1 2; do
  q=/tmp/ws/qB.jsonl; [ $r = 2 ] && q=/tmp/ws/qB2.jsonl
  cp /tmp/ws/state/a.bin /tmp/ws/state/warm.bin
  .venv/bin/freespec bench --questions $q --per-category 1 --max-tokens 128 --dtype float32 --warmup 4 \
    --configs hybrid 'hybrid:{"suffix":{"responses_path":"/tmp/ws/state/warm.bin"}}' --out /tmp/ws/round$r
done
