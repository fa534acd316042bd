#!/usr/bin/env bash
# Prove freespec's GPU path on a CUDA machine with stock vLLM, in one command, and pack what to send back.
#
#   bash scripts/gpu_check.sh                      # install from this clone, Qwen/Qwen2.5-0.5B-Instruct
#   bash scripts/gpu_check.sh --model PATH_OR_ID   # another model (a local directory or a hub id)
#   bash scripts/gpu_check.sh --install pypi       # install vllm-freespec[cuda,bench] from PyPI instead
#   bash scripts/gpu_check.sh --dry-run            # print every step, run nothing
#
# Steps (each one's output lands in --out; a failed step is recorded and the next one still runs):
#   1. gpu        nvidia-smi: the card, its memory and driver
#   2. install    a virtual environment (--venv) with freespec and stock vLLM (CUDA wheel), non-editable
#   3. doctor     `freespec doctor`: vLLM's version, every seam probe, which plugins are usable
#   4. model      the model as a local directory (hub ids are downloaded into the Hugging Face cache)
#   5. lossless   scripts/gpu_lossless.py: greedy text with vLLM's ngram and each freespec plugin is the
#                 text without speculation (float32; a first difference on a top-2 tie is allowed)
#   6. bench      `freespec bench`: none, ngram, suffix, copy, hybrid at concurrency 1 and 16
#   7. runners    `freespec bench --configs none` on each vLLM model runner (VLLM_USE_V2_MODEL_RUNNER=1, then
#                 =0): Model Runner V2, vLLM's default on CUDA, does not take custom_class, so every plugin
#                 (and vLLM's suffix, ngram) runs on V1; the two rows show what that fallback costs
#   8. kernels    scripts/kernel_timing.py: the Triton kernels against their torch references
# Then summary.md (each step's status) and <out>.tar.gz, and the lines saying what to send back.
#
# Options:
#   --model M          model directory or hub id (default: Qwen/Qwen2.5-0.5B-Instruct)
#   --out DIR          output folder (default: gpu_check_<UTC time>)
#   --install MODE     clone (default: pip install this checkout), pypi (pip install vllm-freespec), or
#                      none (use --python as it is: freespec and vLLM already installed there)
#   --venv DIR         environment for --install clone/pypi (default: ~/.cache/freespec/gpu-venv)
#   --python PY        interpreter that makes the environment, or runs everything with --install none
#                      (default: python3; vLLM needs 3.11 or newer)
#   --plugins "P ..."  configs for the lossless check (default: ngram copy recycle retrieval hybrid pearl)
#   --configs "C ..."  configs for the bench (default: none ngram suffix copy hybrid)
#   --concurrency "N ..."  bench load levels (default: 1 16)
#   --bench-args "..." extra arguments for `freespec bench` (e.g. "--questions question.jsonl")
#   --skip STEP        leave out a step (repeatable): gpu install doctor model lossless bench runners kernels
#   --dry-run          print the steps with their commands and exit
#   -h, --help         this text
set -uo pipefail
CALLER=$(pwd)
ARGS="$*"
cd "$(dirname "$0")/.." || exit 2
REPO=$(pwd)

MODEL="Qwen/Qwen2.5-0.5B-Instruct"
OUT=""
INSTALL=clone
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/freespec/gpu-venv"
PYTHON=python3
PLUGINS="ngram copy recycle retrieval hybrid pearl"
CONFIGS="none ngram suffix copy hybrid"
CONCURRENCY="1 16"
BENCH_ARGS=""
SKIP=" "
DRY=0
STEPS="gpu install doctor model lossless bench runners kernels"

usage() { sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "gpu_check: $*" >&2; exit 2; }
need() { if [ $# -lt 2 ] || [ -z "$2" ] || [[ "$2" == --* ]]; then die "$1 needs a value (see --help)"; fi; }

while [ $# -gt 0 ]; do
  case "$1" in
    --model) need "$@"; MODEL=$2; shift 2 ;;
    --out) need "$@"; OUT=$2; shift 2 ;;
    --install) need "$@"; INSTALL=$2; shift 2 ;;
    --venv) need "$@"; VENV=$2; shift 2 ;;
    --python) need "$@"; PYTHON=$2; shift 2 ;;
    --plugins) need "$@"; PLUGINS=$2; shift 2 ;;
    --configs) need "$@"; CONFIGS=$2; shift 2 ;;
    --concurrency) need "$@"; CONCURRENCY=$2; shift 2 ;;
    --bench-args) need "$@"; BENCH_ARGS=$2; shift 2 ;;
    --skip) need "$@"; SKIP="$SKIP$2 "; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
case "$INSTALL" in clone|pypi|none) ;; *) die "--install must be clone, pypi or none, not '$INSTALL'" ;; esac
for step in $SKIP; do
  [[ " $STEPS " == *" $step "* ]] || die "--skip: no step named '$step' (steps: $STEPS)"
done
for plugin in $PLUGINS; do
  [[ " ngram copy recycle retrieval hybrid pearl " == *" $plugin "* ]] \
    || die "--plugins: '$plugin' is not one of ngram copy recycle retrieval hybrid pearl"
done
for level in $CONCURRENCY; do
  [[ "$level" =~ ^[1-9][0-9]*$ ]] || die "--concurrency: '$level' is not a positive integer"
done
# Paths given on the command line are relative to where the command was typed.
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$CALLER/$1" ;; esac; }
[ -n "$OUT" ] || OUT="gpu_check_$(date -u +%Y%m%dT%H%M%SZ)"
OUT=$(absolute "${OUT%/}")
VENV=$(absolute "$VENV")
[ -d "$(absolute "$MODEL")" ] && MODEL=$(absolute "$MODEL")
ARCHIVE="$OUT.tar.gz"

if [ "$INSTALL" = none ]; then
  PY=$(command -v "$PYTHON" || echo "$PYTHON")
  FREESPEC=("$PY" -m freespec.cli.main)
else
  PY="$VENV/bin/python"
  FREESPEC=("$VENV/bin/freespec")
fi

declare -A STATUS=()

# x CMD...: run it, or with --dry-run print it.
x() {
  if [ "$DRY" = 1 ]; then printf '     $'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}

# run STEP LOG CMD...: the command with its output in $OUT/LOG (and on the terminal); records the status.
run() {
  local step=$1 log=$2
  shift 2
  if [[ "$SKIP" == *" $step "* ]]; then
    STATUS[$step]="skipped"
    echo "== $step: skipped"
    return 0
  fi
  if [ "$DRY" = 1 ]; then
    echo "== $step (-> $OUT/$log)"
    if declare -F "$1" >/dev/null; then "$@"; else x "$@"; fi
    return 0
  fi
  echo "== $step (log: $OUT/$log)"
  local started rc
  started=$(date +%s)
  "$@" 2>&1 | tee -a "$OUT/$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" = 0 ]; then
    STATUS[$step]="ok ($(( $(date +%s) - started )) s)"
  else
    STATUS[$step]="FAILED (exit $rc, $(( $(date +%s) - started )) s; see $log)"
  fi
  return "$rc"
}

# shellcheck disable=SC2317  # called through run
install_freespec() {
  local target
  if [ "$INSTALL" = pypi ]; then target="vllm-freespec[cuda,bench]"; else target="${REPO}[cuda,bench]"; fi
  x "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "vLLM needs Python 3.11 or newer")' \
    || return 1
  [ -x "$PY" ] || x "$PYTHON" -m venv "$VENV" || return 1
  x "$PY" -m pip install --upgrade pip || return 1
  x "$PY" -m pip install "$target" || return 1
  [ "$DRY" = 1 ] || "$PY" -m pip list 2>/dev/null \
    | grep -iE '^(vllm|vllm-freespec|torch|triton|transformers|arctic-inference) '
}

# shellcheck disable=SC2317  # called through run
resolve_model() {
  if [ "$DRY" = 1 ]; then
    echo "     \$ $PY: huggingface_hub.snapshot_download('$MODEL') unless it is a directory; the path goes to" \
      "$OUT/model_dir.txt and the next steps use it"
    return 0
  fi
  "$PY" - "$MODEL" "$OUT/model_dir.txt" <<'EOF'
import sys
from pathlib import Path

model, out = sys.argv[1], Path(sys.argv[2])
if Path(model).is_dir():
    path = str(Path(model).resolve())
else:
    from huggingface_hub import snapshot_download

    path = snapshot_download(model)
out.write_text(path + "\n")
print(path)
EOF
}

# shellcheck disable=SC2317,SC2086  # called through run; word splitting of the lists is intended
runner_baselines() {
  # No speculation on each model runner, same questions and load levels as the bench step. V1 is where
  # every custom_class plugin runs (vLLM falls back to it); V2 is vLLM's default for plain decoding.
  local rc=0 runner
  for runner in 2 1; do
    x env VLLM_USE_V2_MODEL_RUNNER=$(( runner - 1 )) "${FREESPEC[@]}" bench --model "$(model_dir)" --configs none \
      --concurrency $CONCURRENCY --per-category 2 --max-tokens 128 --out "$OUT/runner_v$runner" $BENCH_ARGS || rc=1
  done
  return "$rc"
}

# The model as the model step resolved it (the hub id itself when that step was skipped or dry).
model_dir() {
  if [ "$DRY" = 0 ] && [ -s "$OUT/model_dir.txt" ]; then cat "$OUT/model_dir.txt"; else echo "$MODEL"; fi
}

if [ "$DRY" = 1 ]; then
  echo "gpu_check dry run: nothing is installed or run. Output folder would be $OUT, its archive $OUT.tar.gz."
else
  mkdir -p "$OUT" || die "cannot create $OUT"
  { echo "command: $0 $ARGS"; echo "commit: $(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo none)";
    echo "date: $(date -u +%FT%TZ)"; echo "model: $MODEL"; echo "install: $INSTALL"; } > "$OUT/run.txt"
fi

# shellcheck disable=SC2086  # word splitting of the lists is intended
{
if ! run gpu gpu.txt nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv; then
  echo "gpu_check: no usable NVIDIA GPU here (nvidia-smi failed; $OUT/gpu.txt). This check is for CUDA machines." >&2
  exit 1
fi
[ "$DRY" = 1 ] || [[ "$SKIP" == *" gpu "* ]] || nvidia-smi >> "$OUT/gpu.txt" 2>&1
if [ "$INSTALL" != none ]; then run install install.log install_freespec; else STATUS[install]="none (--install none)"; fi
run doctor doctor.txt "${FREESPEC[@]}" doctor
[ "$DRY" = 1 ] || [[ "$SKIP" == *" doctor "* ]] || "${FREESPEC[@]}" doctor --json > "$OUT/doctor.json" 2>/dev/null \
  || rm -f "$OUT/doctor.json"
run model model.log resolve_model
run lossless lossless.log "$PY" "$REPO/scripts/gpu_lossless.py" --model "$(model_dir)" --plugins $PLUGINS \
  --out "$OUT/lossless"
run bench bench.log "${FREESPEC[@]}" bench --model "$(model_dir)" --configs $CONFIGS --concurrency $CONCURRENCY \
  --per-category 2 --max-tokens 128 --reuse-server --out "$OUT/bench" $BENCH_ARGS
run runners runners.log runner_baselines
run kernels kernels.log "$PY" "$REPO/scripts/kernel_timing.py" --out "$OUT/kernel_timing.json"
}

if [ "$DRY" = 1 ]; then
  echo "== pack: $OUT/summary.md (each step's status), then $ARCHIVE (the folder; no model weights)"
  exit 0
fi

failed=0
{
  echo "# freespec GPU check"
  echo
  cat "$OUT/run.txt"
  echo
  echo '```'
  head -3 "$OUT/gpu.txt" 2>/dev/null
  head -4 "$OUT/doctor.txt" 2>/dev/null
  echo '```'
  echo
  echo "| step | status |"
  echo "|---|---|"
  for step in $STEPS; do
    echo "| $step | ${STATUS[$step]:-not run} |"
    [[ "${STATUS[$step]:-}" == FAILED* ]] && failed=1
  done
  echo
  [ -f "$OUT/lossless/lossless.md" ] && { echo "## Lossless"; echo; cat "$OUT/lossless/lossless.md"; echo; }
  [ -f "$OUT/bench/results.md" ] && { echo "## Bench"; echo; cat "$OUT/bench/results.md"; echo; }
  for runner in 2 1; do
    [ -f "$OUT/runner_v$runner/results.md" ] || continue
    echo "## No speculation on Model Runner V$runner (VLLM_USE_V2_MODEL_RUNNER=$(( runner - 1 )))"
    echo
    [ "$runner" = 1 ] && echo "freespec's plugins run on this runner (V2 does not take custom_class)." && echo
    cat "$OUT/runner_v$runner/results.md"
    echo
  done
} > "$OUT/summary.md"
tar -C "$(dirname "$OUT")" -czf "$ARCHIVE" "$(basename "$OUT")"
cat "$OUT/summary.md"
echo
echo "Send back this one file: $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1))"
echo "It holds: summary.md (read it first), gpu.txt, install.log, doctor.txt, lossless/ (verdicts and every"
echo "engine's log), bench/ (results.md, results.json, server logs), runner_v2/ and runner_v1/ (no speculation on"
echo "each model runner), kernel_timing.json and every step's log."
echo "Attach it to the issue, or, if it is too large, send summary.md and lossless/lossless.json."
exit "$failed"
