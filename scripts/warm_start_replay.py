"""What a persisted response store gains after a restart, replayed without an engine (tokens per forward).

Under greedy decoding a `freespec bench` run's `none` answers are the target's own text, so a draft's
accepted tokens are its common prefix with them. This replays the `suffix` source (hybrid's default
source) over the run's questions in two halves, A (each category's first question) and B (its second):

- cold: a fresh source answers B;
- warm, fresh traffic: a source that saved A's answers, restarted, answers B;
- warm, repeated traffic: a source that saved A's and B's answers, restarted, answers B again.

It ignores cost and batching: an estimate of drafting, not a benchmark.

    .venv/bin/python scripts/warm_start_replay.py bench_results/RUN/results.json --questions question.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

from freespec.proposers.base import EngineInfo, Row
from freespec.proposers.suffix_tree import SuffixOptions, SuffixTreeProposer
from freespec.questions import resolve_questions


def answer(source: SuffixTreeProposer, questions, first_key: int) -> float:
    """Replay each (prompt, output) as the engine would; output tokens per target forward pass."""
    tokens = steps = 0
    for key, (prompt, out) in enumerate(questions, start=first_key):
        seq, t, new = list(prompt) + out[:1], 1, 1  # the prefill step produced the first token
        steps += 1
        while t < len(out):
            draft = source.propose([Row(key=key, tokens=np.asarray(seq, dtype=np.int32), num_new=new)])[0]
            accepted = 0
            while accepted < len(draft) and t + accepted < len(out) and draft[accepted] == out[t + accepted]:
                accepted += 1
            new = min(accepted + 1, len(out) - t)
            seq += out[t:t + new]
            t += new
            steps += 1
        source.release(key)
        tokens += len(out)
    return tokens / steps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="results.json of a greedy `freespec bench` run with --per-category 2 or more")
    p.add_argument("--questions", required=True, help="the question.jsonl the run measured")
    args = p.parse_args()
    from transformers import AutoTokenizer

    run = json.loads(open(args.results).read())
    model = run["settings"]["model"]
    prompts = {q.question_id: q.prompt for q in resolve_questions(args.questions).questions}
    tok = AutoTokenizer.from_pretrained(model)
    info = EngineInfo(vocab_size=len(tok), model=model, tokenizer_fingerprint=lambda: "replay")
    halves: dict[int, list] = {0: [], 1: []}
    seen: set = set()
    index: dict[str, int] = {}
    for r in run["requests"]:
        if r["config"] != "none" or r.get("error") or r["question_id"] in seen:
            continue
        seen.add(r["question_id"])
        i = index[r["category"]] = index.get(r["category"], -1) + 1
        if i in halves:
            text = tok.apply_chat_template([{"role": "user", "content": prompts[r["question_id"]]}],
                                           add_generation_prompt=True, tokenize=False)
            halves[i].append((tok(text, add_special_tokens=False)["input_ids"],
                              tok(r["output"], add_special_tokens=False)["input_ids"]))
    a, b = halves[0], halves[1]
    if not a or not b:
        print("need at least two questions per category", file=sys.stderr)
        return 2
    path = os.path.join(tempfile.mkdtemp(), "responses.bin")

    def source(persist: bool) -> SuffixTreeProposer:
        s = SuffixTreeProposer(SuffixOptions(responses_path=path if persist else None), 8)
        s.bind(info)
        return s

    cold = answer(source(False), b, 1000)
    first = source(True)
    answer(first, a, 1)
    first.close()
    fresh = answer(source(True), b, 2000)
    again = source(True)
    answer(again, b, 3000)
    again.close()
    repeated = answer(source(True), b, 4000)
    print(f"{len(b)} questions, tokens per forward: cold {cold:.3f}; warm, fresh questions {fresh:.3f}; "
          f"warm, repeated questions {repeated:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
