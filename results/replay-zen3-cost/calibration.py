"""Replay `hybrid` over greedy answers (no engine) and compare the chance it gave each draft token with how
often such tokens were accepted; also tokens per forward and the modeled speed, as scripts/replay_drafts.py.

    python results/replay-zen3-cost/calibration.py greedy.jsonl --token-cost 0.08 --cost 0.063 [--fresh]

--fresh: a new proposer for every question (nothing learned across questions); otherwise one for all, in file
order, as one server. Run from the repository root with freespec installed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from replay_drafts import read_greedy, replay  # noqa: E402

from freespec.proposers.base import EngineInfo  # noqa: E402
from freespec.proposers.registry import load_proposer_class  # noqa: E402

EDGES = [0.0, 0.05, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7, 0.9, 1.01]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("greedy")
    p.add_argument("options", nargs="?", default="{}", help="hybrid's options as JSON")
    p.add_argument("--token-cost", type=float, required=True, help="the goodput bar handed to the proposer")
    p.add_argument("--cost", type=float, default=0.063, help="a draft token's cost in plain steps")
    p.add_argument("--fresh", action="store_true", help="a new proposer for every question")
    p.add_argument("-k", type=int, default=8)
    args = p.parse_args()
    model, data = read_greedy(Path(args.greedy))
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(model))
    cls = load_proposer_class("hybrid")

    def make():
        proposer = cls(cls.Options(**json.loads(args.options)), args.k)
        proposer.bind(EngineInfo(vocab_size=vocab, model=model))
        proposer.token_cost = args.token_cost
        return proposer

    proposer = make()
    records = []  # (position in the draft, claimed chance, accepted)

    def on_draft(draft, accepted):
        chances = (proposer.draft_chances() or [[]])[0]
        for i in range(len(draft)):
            records.append((i, chances[i] if i < len(chances) else np.nan, i < accepted))

    tokens = steps = 0
    spent = 0.0
    for key, (_, prompt, output) in enumerate(data):
        if args.fresh and key:
            proposer = make()
        done = replay(proposer, key, prompt, output, args.cost, on_draft=on_draft)
        tokens, steps, spent = tokens + done[0], steps + done[1], spent + done[2]
    r = np.array(records, dtype=float).reshape(-1, 3)
    print(f"tok/fwd {tokens / steps:.3f}  modeled x none {tokens / spent:.3f} (draft token = {args.cost} steps)  "
          f"draft tokens {len(r)}  accepted {int(r[:, 2].sum())}  claimed {np.nansum(r[:, 1]):.0f}")
    print("claimed chance   tokens  mean claimed  accepted")
    for lo, hi in zip(EDGES, EDGES[1:]):
        m = (r[:, 1] >= lo) & (r[:, 1] < hi)
        if m.any():
            print(f"[{lo:.2f}, {hi:.2f})  {int(m.sum()):7d}  {r[m, 1].mean():12.3f}  {r[m, 2].mean():8.3f}")
    print("draft position   tokens  mean claimed  accepted")
    for i in range(args.k):
        m = r[:, 0] == i
        if m.any():
            print(f"{i + 1:14d}  {int(m.sum()):7d}  {np.nanmean(r[m, 1]):12.3f}  {r[m, 2].mean():8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
