#!/usr/bin/env bash
# Run AW: hybrid started warm from `freespec responses build` against a cold hybrid, vLLM suffix and none,
# bfloat16, concurrency 1, one round per `freespec bench` so every warm server starts from the same file.
#   usage: bash results/run-aw/run_aw.sh QUESTIONS_JSONL OUT_DIR [ROUNDS [DTYPE]]   (DTYPE: bfloat16 by default)
# The responses file is built in bfloat16 whatever DTYPE the benches run in.
set -euo pipefail
Q=$1 OUT=$2 ROUNDS=${3:-2} DTYPE=${4:-bfloat16}
CACHE=${FREESPEC_CACHE:-$HOME/.cache/freespec}
BASE=$CACHE/responses/sharegpt-1000-smollm2-135m-instruct.bin
mkdir -p "$OUT"
if [ ! -f "$BASE" ]; then
  mkdir -p "$(dirname "$BASE")"
  # ShareGPT's user prompts (scripts/corpus_datastore.sh fetches the file), none sharing 12 words with Q.
  freespec responses build --model smollm2-135m-instruct \
    --prompts "$CACHE/corpus/sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json" --limit 1000 --max-tokens 256 \
    --max-model-len 2048 --dtype bfloat16 --exclude "$Q" --out "$BASE"
fi
for r in $(seq 1 "$ROUNDS"); do
  cp "$BASE" "$OUT/warm.bin"  # the server adds its answers to the file: each round starts from the built one
  freespec bench --questions "$Q" --configs none suffix hybrid \
    "hybrid:{\"suffix\":{\"responses_path\":\"$OUT/warm.bin\"}}" --per-category 1 --max-tokens 128 \
    --dtype "$DTYPE" --rounds 1 --out "$OUT/r$r"
done
