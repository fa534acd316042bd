#!/usr/bin/env bash
# On the device machine: the default plugin's per-step time on its host CPU (no vLLM), next to the GPU step.
# Usage: bash .gpu/run_host.sh OUTDIR [PYTHON], from the repository root, with (git-ignored, carried):
#   .whl/  cp312 wheels of pydantic 2.13.4, pydantic-core 2.46.4, annotated-types, typing-inspection, nanobind 2.9.2
#   .gpu/  arctic/ (arctic-inference 0.1.2's csrc/suffix_decoding as csrc/, its suffix_decoding Python files under
#          pkg/arctic_inference/ with an empty __init__.py and a METADATA naming version 0.1.2, its LICENSE),
#          tok/ (the SmolLM2 fixture's config, tokenizer files; tokenizer.json gzipped), greedy.jsonl.gz
#          (scripts/replay_drafts.py --generate's output).
set -uo pipefail
OUTD=$1; PY=${2:-python3}; W=/tmp/fsw; rm -rf $W; mkdir -p $W
{ lscpu | grep -E "Model name|^CPU\(s\)|Thread|L3"; echo "amx_bf16: $(grep -c amx_bf16 /proc/cpuinfo)"; } > $OUTD/host.txt
WHEELS=$(ls .whl/*.whl); [ -n "${LOCAL_TEST:-}" ] && WHEELS=$(ls .whl/nanobind*.whl)
$PY -m pip install -q --no-index --no-deps --no-compile --target $W/site $WHEELS || exit 3
export PYTHONPATH=$W/site
cp -r .gpu/arctic/pkg/. $W/site/
cmake -S .gpu/arctic/csrc -B $W/build -G Ninja -DPython_EXECUTABLE=$(command -v $PY) -DCMAKE_BUILD_TYPE=Release \
  -Dnanobind_DIR=$($PY -m nanobind --cmake_dir) > $OUTD/build.log 2>&1 && cmake --build $W/build -j 16 >> $OUTD/build.log 2>&1 || { tail -20 $OUTD/build.log; exit 4; }
cp $W/build/_C*.so $W/site/arctic_inference/suffix_decoding/
$PY -m pip install -q --no-index --no-deps --no-build-isolation --target $W/fs . > $OUTD/install.log 2>&1 || { tail -20 $OUTD/install.log; exit 5; }
export PYTHONPATH=$W/fs:$W/site
M=/root/.cache/freespec/models/smollm2-135m-instruct; mkdir -p $M && cp .gpu/tok/* $M/ && gunzip -f $M/tokenizer.json.gz && gunzip -c .gpu/greedy.jsonl.gz > $W/greedy.jsonl
(cd /tmp && $PY -c "from freespec.proposers.suffix_tree import available; print('suffix source:', available())") | tee -a $OUTD/host.txt
for ev in 256 0; do
  $PY scripts/replay_drafts.py $W/greedy.jsonl hybrid --memory --time --adapter --limit 24 --evict-mb $ev 2>&1 | grep -E "^all|proposer time" | sed "s/^/hybrid evict=$ev: /"
  $PY scripts/replay_drafts.py $W/greedy.jsonl vllm-suffix --memory --time --limit 24 --evict-mb $ev 2>&1 | grep -E "^all|proposer time" | sed "s/^/vllm-suffix evict=$ev: /"
done | tee $OUTD/proposer_time.txt
