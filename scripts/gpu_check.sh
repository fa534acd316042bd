#!/usr/bin/env bash
# Prove freespec's GPU path on a CUDA machine with stock vLLM, in one command, and pack what to send back.
#
#   bash scripts/gpu_check.sh                      # install from this clone, Qwen/Qwen2.5-0.5B-Instruct
#   bash scripts/gpu_check.sh --model PATH_OR_ID   # another model (a local directory or a hub id)
#   bash scripts/gpu_check.sh --install pypi       # install vllm-freespec[cuda,bench] from PyPI instead
#   bash scripts/gpu_check.sh --dry-run            # print every step, run nothing
#
# The installed vLLM chooses the path: below 0.34 the V1 runner (custom_class), from 0.34 Model Runner V2,
# where each plugin is the registered method freespec_<plugin> (pip installs the newest vLLM in range).
# Steps (each one's output lands in --out; a failed step is recorded and the next one still runs):
#   1. gpu        nvidia-smi: the card, its memory and driver
#   2. install    a virtual environment (--venv) with freespec and stock vLLM (CUDA wheel), non-editable
#   3. doctor     `freespec doctor`: vLLM's version, every seam probe, which plugins are usable
#   4. model      the model as a local directory (hub ids are downloaded into the Hugging Face cache)
#   5. lossless   scripts/gpu_lossless.py: greedy text with vLLM's ngram and each freespec plugin is the
#                 text without speculation (float32; a first difference on a top-2 tie is allowed).
#                 vLLM >= 0.34: vLLM's suffix (V2's GPU suffix decoding), each plugin as {"plugin": ...}
#                 and hybrid as freespec_hybrid by name, each engine with CUDA graphs and also timed at
#                 --concurrency (output tok/s); engines that would end past --budget are not started
#   6. bench      `freespec bench`: none, ngram, suffix, copy, hybrid at concurrency 1 and 16 (vLLM >= 0.34:
#                 only with --configs; the lossless step's engines measured tok/s)
#   7. runners    `freespec bench --configs none` on each vLLM model runner (VLLM_USE_V2_MODEL_RUNNER=1, then
#                 =0): below 0.34, Model Runner V2, vLLM's default on CUDA, does not take custom_class, so
#                 every plugin (and vLLM's suffix, ngram) runs on V1; the two rows show what that costs
#   8. kernels    scripts/kernel_timing.py: the Triton kernels against their torch references
#   9. speculators  vLLM >= 0.34: scripts/device_v2_check.py: V2's suffix speculator (Triton) and freespec's
#                 V2 speculators, propose on CUDA tensors against the CPU reference, step by step
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
#   --vllm VERSION     install this vLLM release (e.g. 0.33.0); with --dry-run, print that release's path
#   --plugins "P ..."  configs for the lossless check (default: ngram copy recycle retrieval hybrid pearl;
#                      vLLM >= 0.34: suffix hybrid freespec_hybrid copy recycle retrieval pearl)
#   --budget S         seconds for the steps after install on vLLM >= 0.34 (default 600)
#   --configs "C ..."  configs for the bench (default: none ngram suffix copy hybrid)
#   --concurrency "N ..."  bench load levels (default: 1 16)
#   --bench-args "..." extra arguments for `freespec bench` (e.g. "--questions question.jsonl")
#   --skip STEP        leave out a step (repeatable): gpu install doctor model lossless bench runners kernels
#                      speculators
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
PLUGINS=""  # by path: V1_PLUGINS or V2_PLUGINS
V1_PLUGINS="ngram copy recycle retrieval hybrid pearl"
V2_PLUGINS="suffix hybrid freespec_hybrid copy recycle retrieval pearl"
KNOWN_PLUGINS="ngram suffix copy recycle retrieval hybrid pearl freespec_copy freespec_recycle freespec_retrieval"
KNOWN_PLUGINS="$KNOWN_PLUGINS freespec_hybrid freespec_pearl"
CONFIGS="none ngram suffix copy hybrid"
CONFIGS_GIVEN=0
VLLM_PIN=""
BUDGET=600
CONCURRENCY="1 16"
BENCH_ARGS=""
SKIP=" "
DRY=0
STEPS="gpu install doctor model lossless bench runners kernels speculators"

usage() { sed -n '2,49p' "$0" | sed 's/^# \{0,1\}//'; }
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
    --configs) need "$@"; CONFIGS=$2; CONFIGS_GIVEN=1; shift 2 ;;
    --vllm) need "$@"; VLLM_PIN=$2; shift 2 ;;
    --budget) need "$@"; BUDGET=$2; shift 2 ;;
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
  [[ " $KNOWN_PLUGINS " == *" $plugin "* ]] || die "--plugins: '$plugin' is not one of $KNOWN_PLUGINS"
done
[ -z "$VLLM_PIN" ] || [[ "$VLLM_PIN" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "--vllm: '$VLLM_PIN' is not a release like 0.34.0"
[[ "$BUDGET" =~ ^[1-9][0-9]*$ ]] || die "--budget: '$BUDGET' is not a positive number of seconds"
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
  if [ -n "$VLLM_PIN" ]; then x "$PY" -m pip install "$target" "vllm==$VLLM_PIN" || return 1
  else x "$PY" -m pip install "$target" || return 1; fi
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

# The installed vLLM's version: --vllm's when nothing is installed to ask (a dry run, a failed install).
vllm_version() {
  local version=""
  [ "$DRY" = 1 ] || version=$("$PY" -c 'import importlib.metadata as m; print(m.version("vllm"))' 2>/dev/null)
  echo "${version:-$VLLM_PIN}"
}

# Whether vLLM $1 runs freespec on Model Runner V2 (version_gate.py decides: plain Python, loaded by path).
uses_v2() {
  [ -n "$1" ] && python3 -c 'import importlib.util as u, sys
spec = u.spec_from_file_location("gate", sys.argv[1]); gate = u.module_from_spec(spec); spec.loader.exec_module(gate)
sys.exit(0 if gate.uses_v2_registry(sys.argv[2]) else 1)' "$REPO/vllm_plugins/version_gate.py" "$1" 2>/dev/null
}

# na STEP WHY: a step this path does not run, recorded as such (or as skipped).
na() {
  if [[ "$SKIP" == *" $1 "* ]]; then STATUS[$1]="skipped"; else STATUS[$1]="not on this path: $2"; fi
  echo "== $1: ${STATUS[$1]}"
}

# The steps after install, on the path of vLLM $1 (V1 below 0.34, Model Runner V2 from it).
# shellcheck disable=SC2086  # word splitting of the lists is intended
checks() {
  local version=$1 v2=0 plugins budget
  uses_v2 "$version" && v2=1
  if [ "$v2" = 1 ]; then
    plugins=${PLUGINS:-$V2_PLUGINS}
    echo "-- vLLM $version: Model Runner V2, each plugin the registered method freespec_<plugin>; the steps after" \
      "install within --budget $BUDGET s"
  else
    plugins=${PLUGINS:-$V1_PLUGINS}
    echo "-- vLLM ${version:-below 0.34}: the V1 runner (custom_class) path"
  fi
  echo "vllm: ${version:-unknown}; path: $([ "$v2" = 1 ] && echo "Model Runner V2" || echo "V1")" >> "$RUN_TXT"
  local started=$SECONDS
  run doctor doctor.txt "${FREESPEC[@]}" doctor
  [ "$DRY" = 1 ] || [[ "$SKIP" == *" doctor "* ]] || "${FREESPEC[@]}" doctor --json > "$OUT/doctor.json" 2>/dev/null \
    || rm -f "$OUT/doctor.json"
  run model model.log resolve_model
  if [ "$v2" = 1 ]; then
    # Kernels, speculators (2 turns: its CPU reference runs Triton's interpreter) and packing get the last 180 s
    # of the budget; lossless the rest.
    budget=$(( BUDGET - 180 - (SECONDS - started) ))
    [ "$budget" -gt 60 ] || budget=60
    run lossless lossless.log "$PY" "$REPO/scripts/gpu_lossless.py" --model "$(model_dir)" --plugins $plugins \
      --speed $CONCURRENCY --budget-s "$budget" --out "$OUT/lossless"
    if [ "$CONFIGS_GIVEN" = 1 ]; then
      run bench bench.log "${FREESPEC[@]}" bench --model "$(model_dir)" --configs $CONFIGS --concurrency $CONCURRENCY \
        --per-category 2 --max-tokens 128 --reuse-server --out "$OUT/bench" $BENCH_ARGS
    else
      na bench "vLLM >= 0.34 without --configs: the lossless step's engines measured tok/s"
    fi
    na runners "vLLM >= 0.34 has Model Runner V2 only"
  else
    run lossless lossless.log "$PY" "$REPO/scripts/gpu_lossless.py" --model "$(model_dir)" --plugins $plugins \
      --out "$OUT/lossless"
    run bench bench.log "${FREESPEC[@]}" bench --model "$(model_dir)" --configs $CONFIGS --concurrency $CONCURRENCY \
      --per-category 2 --max-tokens 128 --reuse-server --out "$OUT/bench" $BENCH_ARGS
    run runners runners.log runner_baselines
  fi
  run kernels kernels.log "$PY" "$REPO/scripts/kernel_timing.py" --out "$OUT/kernel_timing.json"
  if [ "$v2" = 1 ]; then
    run speculators speculators.log "$PY" "$REPO/scripts/device_v2_check.py" --device cuda --turns 2 \
      --out "$OUT/speculators.json"
  else
    na speculators "vLLM < 0.34 has no Model Runner V2 speculators"
  fi
}

RUN_TXT=/dev/null
if [ "$DRY" = 1 ]; then
  echo "gpu_check dry run: nothing is installed or run. Output folder would be $OUT, its archive $OUT.tar.gz."
else
  mkdir -p "$OUT" || die "cannot create $OUT"
  RUN_TXT=$OUT/run.txt
  { echo "command: $0 $ARGS"; echo "commit: $(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo none)";
    echo "date: $(date -u +%FT%TZ)"; echo "model: $MODEL"; echo "install: $INSTALL"; } > "$RUN_TXT"
fi

{
if ! run gpu gpu.txt nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv; then
  echo "gpu_check: no usable NVIDIA GPU here (nvidia-smi failed; $OUT/gpu.txt). This check is for CUDA machines." >&2
  exit 1
fi
[ "$DRY" = 1 ] || [[ "$SKIP" == *" gpu "* ]] || nvidia-smi >> "$OUT/gpu.txt" 2>&1
if [ "$INSTALL" != none ]; then run install install.log install_freespec; else STATUS[install]="none (--install none)"; fi
VLLM_VERSION=$(vllm_version)
checks "$VLLM_VERSION"
if [ "$DRY" = 1 ] && [ -z "$VLLM_VERSION" ]; then
  # pip installs the newest vLLM in range, 0.34: that path too (--vllm VERSION prints one path alone).
  echo
  echo "-- pip installs the newest vLLM in range, so by default:"
  checks "0.34.0"
fi
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
  [ -f "$OUT/speculators.md" ] && { echo "## V2 speculators on the GPU"; echo; cat "$OUT/speculators.md"; echo; }
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
echo "It holds: summary.md (read it first), gpu.txt, install.log, doctor.txt, lossless/ (verdicts, tok/s on vLLM"
echo ">= 0.34, every engine's log), bench/ (results.md, results.json, server logs), runner_v2/ and runner_v1/ (no"
echo "speculation on each model runner, below 0.34), kernel_timing.json, speculators.json and every step's log."
echo "Attach it to the issue, or, if it is too large, send summary.md and lossless/lossless.json."
exit "$failed"
