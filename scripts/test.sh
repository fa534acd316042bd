#!/usr/bin/env bash
# Run freespec's tests: unit tests, then integration tests on the real vLLM CPU engine and
# SmolLM2-135M-Instruct (about 15 minutes on 2 cores). Sets the machine up first if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest -q -p no:cacheprovider tests integration_tests "$@"
