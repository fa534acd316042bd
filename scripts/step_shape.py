"""What a draft token costs on this machine: one request's step time against the tokens the step scores,
through the real engine.

A measuring plugin (``WrongDrafts``) drafts n tokens that are never right (token 0), n cycling 0..K step by step,
so every step makes one token and every size meets the same contexts. The worker appends "scored-tokens seconds"
(from the start of one draft call to the next: the target's forward, sampling and vLLM's bookkeeping) to
``--out``; the script then prints a table of median and mean milliseconds per size. One question a category of a
Spec-Bench-style file, one at a time, ``--max-tokens`` each (EOS ignored). Slope over the one-token step: the
price ``scripts/replay_drafts.py --cost`` takes (results/issue69-zen3).

    python scripts/step_shape.py --questions question.jsonl --dtype float32 --out steps.txt [--model DIR]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from freespec.proposers.base import Draft, Proposer

OUT_VARIABLE = "STEP_SHAPE_OUT"  # read by the plugin in the engine's worker


class WrongDrafts(Proposer):
    """Drafts ``step % (k + 1)`` tokens of id 0 for a lone request (none in a batch) and records each step."""

    def __init__(self, options, num_speculative_tokens: int) -> None:
        super().__init__(options, num_speculative_tokens)
        self.step, self.last, self.scored = 0, None, 1
        self.out = open(os.environ[OUT_VARIABLE], "a", encoding="utf-8")

    def draft(self, rows, step):
        now = time.perf_counter()
        if self.last is not None and len(rows) == 1 and rows[0].num_new == 1:  # a decode step, not a prefill
            self.out.write(f"{self.scored} {now - self.last:.6f}\n")
            self.out.flush()
        n = self.step % (self.k + 1) if len(rows) == 1 else 0
        self.step += 1
        self.scored, self.last = 1 + n, now
        return [Draft([0] * n) for _ in rows]


def table(lines) -> str:
    """Markdown: steps, median and mean ms per scored size, from "size seconds" lines."""
    by: dict[int, list[float]] = {}
    for line in lines:
        if line.strip():
            n, s = line.split()
            by.setdefault(int(n), []).append(float(s) * 1e3)
    rows = [f"| {n} | {len(v)} | {statistics.median(v):.1f} | {statistics.mean(v):.1f} |" for n, v in sorted(by.items())]
    return "\n".join(["| scored tokens | steps | median ms | mean ms |", "|---:|---:|---:|---:|", *rows])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", required=True, help="a Spec-Bench-style question.jsonl, or 'builtin'")
    ap.add_argument("--model", help="the target (default: the SmolLM2 test fixture)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", required=True, help="where the steps are written (replaced)")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("-k", type=int, default=8, help="the largest draft (default 8)")
    a = ap.parse_args()
    from vllm import LLM, SamplingParams

    from freespec.bench.selection import select_questions
    from freespec.model_store import model_dir
    from freespec.questions import resolve_questions

    os.environ[OUT_VARIABLE] = os.path.abspath(a.out)
    # the engine's worker imports the plugin by module name: this folder on its path
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, here)
    open(a.out, "w").close()
    chosen = select_questions(resolve_questions(a.questions).questions, None, a.per_category)
    prompts = [[{"role": "user", "content": q.prompt}] for qs in chosen.values() for q in qs]
    llm = LLM(model=a.model or str(model_dir("smollm2-135m-instruct")), dtype=a.dtype, max_model_len=2048, seed=0,
              speculative_config={"plugin": "step_shape:WrongDrafts", "num_speculative_tokens": a.k,
                                  "policy": "fixed", "pad": "off", "step_aside": False})
    params = SamplingParams(max_tokens=a.max_tokens, temperature=0.0, ignore_eos=True)
    for p in prompts:  # one request at a time
        llm.chat([p], params, use_tqdm=False)
    with open(a.out, encoding="utf-8") as f:
        print(table(f))
    return 0


if __name__ == "__main__":
    sys.exit(main())
