#!/usr/bin/env bash
# A side environment with vLLM 0.34.0 (Model Runner V2 only) for the vllm034 test tier
# (tests_vllm034/, run by scripts/test_vllm034.sh). Import-level only: no GPU and no compiled kernels
# are needed. vLLM goes in with --no-deps plus its other requirements: one of its pins,
# flashinfer-python==0.7.3, is not on the package index. freespec goes in editable with --no-deps, so
# vLLM's `vllm.general_plugins` entry point finds it, and arctic-inference (hybrid's default suffix source)
# built from its sdist (below). Idempotent: a second run only checks.
# Prints the environment's python on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
VENV=${FREESPEC_VLLM034_VENV:-$HOME/.cache/freespec/vllm034-venv}
VLLM=${FREESPEC_VLLM034_VERSION:-0.34.0}
TORCH=${FREESPEC_VLLM034_TORCH:-2.14.0}  # vLLM 0.34.0's own pin (its torchvision pin holds torch there anyway)
ARCTIC=${FREESPEC_VLLM034_ARCTIC:-arctic-inference>=0.1.1,<0.2}  # as freespec's cuda extra asks
STAMP=$VENV/.freespec-vllm034
# Requirements of vLLM left out: not on the index (flashinfer), or installed above on their own (torch).
SKIP='^(flashinfer-python|flashinfer-cubin|torch)$'

want=$(printf '%s %s %s %s\n' "$VLLM" "$TORCH" "$ARCTIC" "$(sha256sum scripts/setup_vllm034.sh | cut -d' ' -f1)")
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  [ -x "$VENV/bin/python" ] || { echo "==> creating $VENV" >&2; mkdir -p "$(dirname "$VENV")"; $PY -m venv "$VENV"; }
  pip=("$VENV/bin/python" -m pip install -q --progress-bar off)
  echo "==> torch $TORCH and vllm $VLLM (--no-deps)" >&2
  "${pip[@]}" "torch==$TORCH" >&2
  "${pip[@]}" --no-deps "vllm==$VLLM" >&2
  reqs=$(mktemp)
  # vLLM's own requirements (extras left out), less the skipped ones; pip evaluates the markers.
  "$VENV/bin/python" - "$SKIP" > "$reqs" <<'PY'
import importlib.metadata as md, re, sys
skip = re.compile(sys.argv[1])
for req in md.requires("vllm") or []:
    if "extra ==" in req.replace('extra==', 'extra =='):
        continue
    name = re.split(r"[\s\[<>=!~;(]", req, maxsplit=1)[0]
    if not skip.match(name.lower()):
        print(req)
PY
  echo "==> vllm's other requirements ($(wc -l < "$reqs") lines, less flashinfer)" >&2
  "${pip[@]}" -r "$reqs" >&2
  rm -f "$reqs"
  "${pip[@]}" pytest >&2
  echo "==> freespec (editable, --no-deps)" >&2
  "${pip[@]}" --no-deps -e . >&2
  # freespec's own light requirements (numpy arrives with vLLM).
  "${pip[@]}" "numba>=0.60" "pydantic>=2.5" "pydivsufsort>=0.0.20,<0.1" "tqdm>=4.66" >&2
  # arctic-inference: every release is an sdist whose setup.py imports torch (for CMake's prefix path) and
  # whose build needs nanobind, grpcio-tools and cmake. It is built without isolation in a venv of its own
  # that borrows this environment's torch through a .pth file for the build only (as release_matrix.sh does),
  # so no build requirement lands here (grpcio-tools would move vLLM's grpcio); the wheel goes in --no-deps.
  # About 4 minutes on 2 cores, once (pip caches the wheel). Its vLLM plugin stays off (ARCTIC_INFERENCE_ENABLED).
  if ! "$VENV/bin/python" -c 'import arctic_inference.suffix_decoding' 2>/dev/null; then
    echo "==> $ARCTIC (built from its sdist)" >&2
    build=$VENV-arctic-build wheels=$(mktemp -d)
    [ -x "$build/bin/python" ] || $PY -m venv "$build"
    "$build/bin/python" -m pip install -q --progress-bar off setuptools wheel "nanobind==2.9.2" ninja cmake \
      protobuf grpcio-tools numpy >&2
    site=$("$build/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/zz-borrowed-torch.pth"
    rc=0
    CMAKE_ARGS="-DPython_EXECUTABLE=$build/bin/python" "$build/bin/python" -m pip wheel -q --no-build-isolation \
      --no-deps "$ARCTIC" -w "$wheels" >&2 || rc=$?
    rm -f "$site/zz-borrowed-torch.pth"
    [ "$rc" = 0 ] || { echo "setup_vllm034: building $ARCTIC failed (needs cmake and a C++20 compiler)" >&2; exit "$rc"; }
    "${pip[@]}" --no-deps "$wheels"/arctic_inference-*.whl >&2
    rm -rf "$wheels"
  fi
  echo "$want" > "$STAMP"
fi
"$VENV/bin/python" -c "import vllm, freespec, arctic_inference.suffix_decoding; assert vllm.__version__ == '$VLLM', vllm.__version__" >&2
echo "$VENV/bin/python"
