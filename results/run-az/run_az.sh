#!/bin/bash
# Run AZ: the default hybrid against its suffix source with longer tree drafts (max_spec_factor 2; 4 with
# min_token_prob 0.02), cut by the goodput bar and sized by the step size; none and vLLM suffix beside them,
# interleaved, c=1, 13 questions, 2 rounds. DTYPE (default bfloat16), W (the work folder) and CONFIGS change it:
# the float32 rounds ran DTYPE=float32 W=/tmp/run-az-f32 CONFIGS=f4 (none, suffix, hybrid, max_spec_factor 4).
source "$(dirname "$0")/../../.venv/bin/activate"
QFILE=${1:?Spec-Bench question.jsonl}
DTYPE=${DTYPE:-bfloat16}
W=${W:-/tmp/run-az}
F2='hybrid:{"suffix":{"max_spec_factor":2}}'
F4='hybrid:{"suffix":{"max_spec_factor":4,"min_token_prob":0.02}}'
if [ "${CONFIGS:-all}" = f4 ]; then set -- suffix hybrid "$F4"; else set -- suffix hybrid "$F2" "$F4"; fi
mkdir -p $W
for r in 1 2; do
  freespec bench --questions $QFILE --configs none "$@" \
    --per-category 1 --max-tokens 128 --dtype $DTYPE --interleave --out $W/r$r > $W/r$r.log 2>&1
  echo "round $r rc=$?" >> $W/done.txt
done
