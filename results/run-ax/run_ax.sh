#!/bin/bash
# Interleaved bf16: none, suffix, hybrid cold, hybrid warm; one bench per round (the warm file copied fresh, so
# no round starts from what an earlier round learned). DTYPE and W (the work folder) change it: run AY is
# DTYPE=float32 W=/tmp/run-ay.
source "$(dirname "$0")/../../.venv/bin/activate"
Q=${1:?Spec-Bench question.jsonl}
DTYPE=${DTYPE:-bfloat16}
W=${W:-/tmp/run-ax}
BASE=~/.cache/freespec/responses/sharegpt-1000-smollm2-135m-instruct.bin
mkdir -p $W
for r in 1 2; do
  cp $BASE $W/warm.bin
  freespec bench --questions $Q --configs none suffix hybrid "hybrid:{\"suffix\":{\"responses_path\":\"$W/warm.bin\"}}" \
    --per-category 1 --max-tokens 128 --dtype $DTYPE --interleave --out $W/r$r > $W/r$r.log 2>&1
  echo "round $r rc=$?" >> $W/done.txt
done
