"""One config's speed against another's, from a `freespec bench` results.json: overall, per category and
by round, with the slowest-fastest pairing of rounds as `freespec bench` gives it against `none`.

    python scripts/compare_configs.py bench_results/run-ag/results.json hybrid suffix [--concurrency 1]

A round's speed is the config's completion tokens over its blocks' wall time, per category or pooled.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict


def speeds(result: dict, concurrency: int) -> tuple[dict, list, list]:
    """{(config, category, round): tok/s}, the categories in order, the rounds."""
    tokens: dict = defaultdict(int)
    wall: dict = defaultdict(float)
    for r in result["requests"]:
        if r["concurrency"] == concurrency:
            tokens[(r["config"], r["category"], r["round"])] += r["completion_tokens"] or 0
    for b in result["blocks"]:
        if b["concurrency"] == concurrency:
            wall[(b["config"], b["category"], b["round"])] += b["wall_s"]
    categories = list(dict.fromkeys(k[1] for k in tokens))
    rounds = sorted({k[2] for k in tokens})
    for config in {k[0] for k in tokens}:
        for rd in rounds:
            tokens[(config, "all", rd)] = sum(tokens[(config, c, rd)] for c in categories)
            wall[(config, "all", rd)] = sum(wall[(config, c, rd)] for c in categories)
    return {k: tokens[k] / wall[k] for k in tokens if wall.get(k)}, categories + ["all"], rounds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results")
    p.add_argument("config")
    p.add_argument("against")
    p.add_argument("--concurrency", type=int, default=1)
    args = p.parse_args()
    speed, categories, rounds = speeds(json.load(open(args.results)), args.concurrency)
    print(f"| category | {args.config} / {args.against} | slowest–fastest pairing | by round |\n|---|---:|---:|---|")
    for category in categories:
        a = [speed[(args.config, category, rd)] for rd in rounds]
        b = [speed[(args.against, category, rd)] for rd in rounds]
        ratio = (sum(a) / len(a)) / (sum(b) / len(b))
        by_round = " ".join(f"{x / y:.3f}" for x, y in zip(a, b))
        print(f"| {category} | {ratio:.3f} | {min(a) / max(b):.3f}–{max(a) / min(b):.3f} | {by_round} |")


if __name__ == "__main__":
    main()
