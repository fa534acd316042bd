#!/usr/bin/env bash
# RASD on the Qwen2.5-Coder 1.5B/0.5B pair (issue 16): one question per Spec-Bench category at concurrency 1,
# 64 tokens, K = 4, float32, the configs named (default: all five, as in run 1):
#   none, pearl (the draft on core 1), retrieval (the corpus datastore), hybrid-draft (hybrid with the datastore
#   and the draft model: RASD), hybrid (hybrid with the datastore), draft_model (vLLM's).
# Needs both models prepared (freespec models prepare ...) and the Qwen corpus datastore
# (bash scripts/corpus_datastore.sh qwen2.5-coder-1.5b-instruct QUESTIONS).
# Usage: bash results/rasd-qwen/run.sh QUESTIONS OUT [CONFIG ...]
#   run 1: (default)   run 2: none retrieval hybrid-draft hybrid   run 3: none hybrid-draft
set -euo pipefail
Q=$1 OUT=$2
shift 2
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(none pearl retrieval hybrid-draft draft_model)
M=~/.cache/freespec/models/qwen2.5-coder-1.5b-instruct
D=~/.cache/freespec/models/qwen2.5-coder-0.5b-instruct
S=~/.cache/freespec/datastores/sharegpt-stdlib-qwen2.5-coder-1.5b-instruct
configs=()
for name in "${names[@]}"; do
  case $name in
    none) configs+=(none) ;;
    pearl) configs+=("pearl:{\"draft_model\":\"$D\",\"draft_cores\":\"1\"}") ;;
    retrieval) configs+=("retrieval:{\"datastore\":\"$S\"}") ;;
    hybrid-draft) configs+=("hybrid:{\"datastore\":\"$S\",\"draft_model\":\"$D\",\"draft\":{\"draft_cores\":\"1\"}}") ;;
    hybrid) configs+=("hybrid:{\"datastore\":\"$S\"}") ;;
    draft_model) configs+=("draft_model:{\"model\":\"$D\"}") ;;
    *) echo "run.sh: unknown config $name" >&2; exit 2 ;;
  esac
done
FREESPEC_STATS_INTERVAL_S=2 VLLM_CPU_KVCACHE_SPACE=2 .venv/bin/freespec bench --questions "$Q" \
  --model "$M" --dtype float32 --num-speculative-tokens 4 --configs "${configs[@]}" \
  --per-category 1 --concurrency 1 --max-tokens 64 --warmup 1 --reuse-server --out "$OUT"
