"""Replay a benchmark's greedy outputs through a freespec proposer, without an engine.

Under greedy decoding the target's text is known from the `none` run of `freespec bench`, so the tokens a
draft would get accepted are its common prefix with what really followed. This replays each measured
question step by step (one request at a time: no cross-request memory, no target top-k, so `recycle`
drafts nothing) and prints output tokens per target forward pass per category. It is a quick estimate for
comparing drafting rules, not a benchmark: it ignores cost and batching.

    .venv/bin/python scripts/replay_drafts.py bench_results/RUN/results.json retrieval '{"datastore": "DIR"}'
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from freespec.proposers.base import EngineInfo, Row
from freespec.proposers.registry import load_proposer_class
from freespec.questions import BUILTIN, resolve_questions


def replay(proposer, prompt: list[int], output: list[int]) -> tuple[int, int]:
    """(output tokens, target forward passes) when ``proposer`` drafts for this greedy output."""
    seq, t, steps, new = list(prompt), 0, 0, len(prompt)
    while t < len(output):
        draft = proposer.propose([Row(key=1, tokens=np.asarray(seq, dtype=np.int32), num_new=new)])[0]
        accepted = 0
        while accepted < len(draft) and t + accepted < len(output) and draft[accepted] == output[t + accepted]:
            accepted += 1
        new = min(accepted + 1, len(output) - t)  # the accepted drafts plus the target's own token
        seq += output[t:t + new]
        t += new
        steps += 1
    proposer.release(1)
    return len(output), steps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="results.json of a greedy `freespec bench` run that includes `none`")
    p.add_argument("plugin")
    p.add_argument("options", nargs="?", default="{}", help="the plugin's options as JSON")
    p.add_argument("-k", type=int, default=8, help="num_speculative_tokens (default 8)")
    args = p.parse_args()
    from transformers import AutoTokenizer

    run = json.loads(Path(args.results).read_text())
    model = run["settings"]["model"]
    # The set the run measured: its file, or the built-in set (runs before question sets: the path).
    settings = run["settings"]
    source = settings.get("questions_file") if "question_set" in settings else settings["questions"]
    chosen = resolve_questions(source or BUILTIN)
    questions = {q.question_id: {"turns": [q.prompt]} for q in chosen.questions}
    tok = AutoTokenizer.from_pretrained(model)
    cls = load_proposer_class(args.plugin)
    options = cls.Options(**json.loads(args.options))
    totals: dict[str, list[int]] = {}
    for r in run["requests"]:
        if r["config"] != "none" or r["concurrency"] != 1 or r.get("error"):
            continue
        text = tok.apply_chat_template([{"role": "user", "content": questions[r["question_id"]]["turns"][0]}],
                                       add_generation_prompt=True, tokenize=False)
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        output = tok(r["output"], add_special_tokens=False)["input_ids"]
        proposer = cls(options, args.k)
        proposer.bind(EngineInfo(vocab_size=len(tok), model=model))
        tokens, steps = replay(proposer, prompt, output)
        total = totals.setdefault(r["category"], [0, 0])
        total[0] += tokens
        total[1] += steps
    if not totals:
        print(f"{args.results}: no greedy `none` requests at concurrency 1", file=sys.stderr)
        return 2
    for category, (tokens, steps) in sorted(totals.items()):
        print(f"{category:20s} {tokens / steps:.2f} tokens per forward")
    tokens, steps = map(sum, zip(*totals.values()))
    print(f"{'all':20s} {tokens / steps:.2f} tokens per forward")
    return 0


if __name__ == "__main__":
    sys.exit(main())
