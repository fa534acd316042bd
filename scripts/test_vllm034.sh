#!/usr/bin/env bash
# The vLLM 0.34 tier (Model Runner V2's speculator registry), on a CPU machine: builds or checks the side
# environment (scripts/setup_vllm034.sh), runs tests_vllm034/ there with vLLM's own code (registration through
# the entry point, SpeculativeConfig, each speculator's propose on recorded histories), then the static seam
# check against that vLLM's installed source. Not part of scripts/test.sh: CI's matrix job runs it
# (scripts/release_matrix.sh --v2-tier). Arguments go to pytest (e.g. -k copy, --junitxml=FILE).
# FREESPEC_VLLM034_JSON=FILE also writes the seam check as JSON. Exit status: pytest's, else source_check's.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(bash scripts/setup_vllm034.sh)
status=0
# test_suffix_hybrid.py runs vLLM's Triton kernels under Triton's interpreter, which vLLM decides on at its first
# import of vllm.triton_utils: in a process of its own, so the rest of the tier keeps Triton off as it assumes.
"$PY" -m pytest -q -p no:cacheprovider tests_vllm034 --ignore=tests_vllm034/test_suffix_hybrid.py "$@" || status=$?
"$PY" -m pytest -q -p no:cacheprovider tests_vllm034/test_suffix_hybrid.py "$@" || { [ $status -ne 0 ] || status=$?; }
site=$("$PY" -c 'import os, vllm; print(os.path.dirname(os.path.dirname(vllm.__file__)))')
json=()
[ -n "${FREESPEC_VLLM034_JSON:-}" ] && json=(--json "$FREESPEC_VLLM034_JSON")
"$PY" -m freespec.vllm_plugins.source_check "$site" ${json[@]+"${json[@]}"} || { [ $status -ne 0 ] || status=$?; }
exit $status
