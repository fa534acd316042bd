#!/bin/bash
# Interleaved bf16: none, suffix, hybrid cold, hybrid warm; one bench per round (the warm file copied fresh).
source /work/main/.venv/bin/activate
Q=${1:?Spec-Bench question.jsonl}
BASE=~/.cache/freespec/responses/sharegpt-1000-smollm2-135m-instruct.bin
for r in 1 2; do
  cp $BASE /tmp/run-ax/warm.bin
  freespec bench --questions $Q --configs none suffix hybrid 'hybrid:{"suffix":{"responses_path":"/tmp/run-ax/warm.bin"}}' \
    --per-category 1 --max-tokens 128 --dtype bfloat16 --interleave --out /tmp/run-ax/r$r > /tmp/run-ax/r$r.log 2>&1
  echo "round $r rc=$?" >> /tmp/run-ax/done.txt
done
