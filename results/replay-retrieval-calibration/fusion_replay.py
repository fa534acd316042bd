"""Replay greedy answers through `hybrid` in bench-sized servers and count what the fused draft loses.

Each group holds the i-th question of every category (13 questions, as `freespec bench --per-category 1`)
and gets a fresh proposer, as a fresh bench server does. Per step it compares the fused draft's accepted
tokens with the best any single source's own chain would have had (`best`), and splits the loss into
"branch" (the draft took another token where that chain was right) and "short" (the draft was right but cut
before that chain's end). No engine: tokens per target forward only (see scripts/replay_drafts.py).

    python results/replay-retrieval-calibration/fusion_replay.py greedy.jsonl '{"datastore": "DIR"}' --groups 20
    python results/replay-retrieval-calibration/fusion_replay.py greedy.jsonl --vllm-suffix --groups 20
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from replay_drafts import VllmSuffix, read_greedy, replay  # noqa: E402

from freespec.proposers.base import EngineInfo  # noqa: E402
from freespec.proposers.hybrid import HybridProposer  # noqa: E402
from freespec.scorers.acceptance import matched_prefix  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("greedy", help="scripts/replay_drafts.py --generate's JSON lines")
    p.add_argument("options", nargs="?", default="{}", help="hybrid's options as JSON (price_sources is turned off)")
    p.add_argument("--groups", type=int, default=20, help="groups of one question per category (default 20)")
    p.add_argument("--token-cost", type=float, default=0.05, help="the goodput bar handed to hybrid (default 0.05)")
    p.add_argument("--vllm-suffix", action="store_true", help="replay vLLM's suffix method instead")
    p.add_argument("--seed", metavar="FILE", help="a response store file (`freespec responses build`) loaded into "
                   "each group's `suffix` source at its start, as responses_path would, but never written")
    args = p.parse_args()
    model, data = read_greedy(Path(args.greedy))
    seed = []
    if args.seed:
        from freespec.cli.responses import MAX_RESPONSES, MAX_STORE_TOKENS
        from freespec.proposers.response_store import read_store
        from freespec.vllm_plugins.adapter import tokenizer_fingerprint

        seed = [e.tokens for e in read_store(args.seed, fingerprint=tokenizer_fingerprint(model), vocab_size=49152,
                                             max_responses=MAX_RESPONSES, max_tokens=MAX_STORE_TOKENS).entries]
    by_category = collections.defaultdict(list)
    for item in data:
        by_category[item[0]].append(item)
    groups = [[qs[i] for qs in by_category.values() if i < len(qs)] for i in range(args.groups)]
    stats: collections.Counter = collections.Counter()
    learn = HybridProposer._learn

    def counting_learn(self, rows):  # the hybrid's own bookkeeping, read before it learns from it
        for row in rows:
            offered = self._offered.get(row.key)
            if offered is None or row.num_new == 0:
                continue
            start, chains, draft, _ = offered
            produced = row.tokens[start : start + self.k + 1].tolist()
            fused, _ = matched_prefix(draft, produced)
            got = {name: matched_prefix(chain, produced)[0] for name, chain in chains.items()}
            best = max(got.values(), default=0)
            stats["steps"] += 1
            stats["fused"] += fused
            stats["best"] += best
            if best > fused:
                stats["lost to a branch" if fused < len(draft) else "lost to a short cut"] += best - fused
        return learn(self, rows)

    HybridProposer._learn = counting_learn
    options = {**json.loads(args.options), "price_sources": False}
    per_category = collections.defaultdict(lambda: [0, 0])
    key = 0
    for group in groups:
        if args.vllm_suffix:
            proposer = VllmSuffix(8)
        else:
            proposer = HybridProposer(HybridProposer.Options(**options), 8)
            proposer.bind(EngineInfo(vocab_size=49152, model=model or ""))
            proposer.token_cost = args.token_cost
            if seed:
                proposer.sources["suffix"]._seed(seed)
        for category, prompt, output in group:
            key += 1
            tokens, steps, _ = replay(proposer, key, prompt, output, 0.033)
            per_category[category][0] += tokens
            per_category[category][1] += steps
    total = [sum(v[0] for v in per_category.values()), sum(v[1] for v in per_category.values())]
    for category, (tokens, steps) in list(per_category.items()) + [("all", total)]:
        print(f"{category:16s} tok/fwd {tokens / steps:.3f}")
    if stats["steps"]:
        print(f"accepted per step: fused {stats['fused'] / stats['steps']:.3f}, best single source "
              f"{stats['best'] / stats['steps']:.3f}; tokens lost to a branch {stats['lost to a branch']}, "
              f"to a short cut {stats['lost to a short cut']} ({stats['steps']} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
