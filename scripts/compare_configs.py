"""One config's speed against another's, from a `freespec bench` results.json: overall, per category and
by round, with the slowest-fastest pairing of rounds as `freespec bench` gives it against `none`.

    python scripts/compare_configs.py bench_results/run-ag/results.json hybrid suffix [--concurrency 1]

A round's speed is the one `freespec bench` wrote for that sample (``aggregates[].per_sample``): completion
tokens over the block's wall time, per category or pooled (``all``).
"""
from __future__ import annotations

import argparse
import json


def speeds(result: dict, concurrency: int) -> tuple[dict, list, list]:
    """{(config, category, sample): tok/s}, the categories in order (``all`` last), the samples ((round,
    repeat) pairs): the per-sample speeds `freespec bench` wrote under ``aggregates``."""
    speed, categories, samples = {}, [], set()
    for row in result["aggregates"]:
        if row["concurrency"] != concurrency:
            continue
        if row["category"] not in categories:
            categories.append(row["category"])
        for sample in row["per_sample"]:
            key = (sample["round"], sample["repeat"])
            speed[(row["config"], row["category"], key)] = sample["tok_per_s"]
            samples.add(key)
    categories.sort(key=lambda c: c == "all")
    return speed, categories, sorted(samples)


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
