"""Chart of `freespec bench` load sweeps: each config's throughput as a ratio to no speculation per load
(with its interval where the run measured each cell more than once), or with `--tpot` its mean time per
output token per load.

    .venv/bin/python scripts/plot_load_sweep.py bench_results/RUN/results.json [MORE.json ...] -o docs/img/load_sweep.png

Several results files (runs with their own `none`) are drawn on one chart, each label tagged with its run's
folder; each ratio is to the `none` of its own run. Config labels are shortened to the plugin name plus its policy (options such as datastore
paths are left out of the legend).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def short_label(config: str) -> str:
    name, _, options = config.partition(":")
    if not options:
        return name
    policy = json.loads(options).get("policy")
    return f"{name} ({policy})" if policy else name


def values_by_config(results: dict, key: str = "ratio") -> dict[str, dict[int, tuple[float, float, float]]]:
    """{short label: {concurrency: (value, low, high)}} of ``key`` over the 'all' category of one run; low and
    high are the ratio interval (the value itself where there is none, and for other keys)."""
    out: dict[str, dict[int, tuple[float, float, float]]] = {}
    for agg in results["aggregates"]:
        value = agg.get(key)
        if agg["category"] != "all" or value is None:
            continue
        low, high = (agg.get("ratio_low"), agg.get("ratio_high")) if key == "ratio" else (None, None)
        out.setdefault(short_label(agg["config"]), {})[agg["concurrency"]] = (
            value, value if low is None else low, value if high is None else high)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--floor", type=float, default=0.97, help="aim line (default 0.97x)")
    ap.add_argument("--tpot", action="store_true", help="mean time per output token (ms) instead of the ratio")
    args = ap.parse_args()
    key = "mean_tpot_ms" if args.tpot else "ratio"

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    ax.set_prop_cycle(color=plt.get_cmap("tab20").colors)  # more configs than the default 10 colours
    levels: set[int] = set()
    for path in args.results:
        for label, by_level in values_by_config(json.loads(path.read_text()), key).items():
            fixed = "(fixed)" in label or label in ("ngram", "suffix")
            if len(args.results) > 1:
                label = f"{label} [{path.parent.name}]"  # which run: each is a ratio to its own `none`
            xs = sorted(by_level)
            levels.update(xs)
            ys = [by_level[x][0] for x in xs]
            yerr = [[y - by_level[x][1] for x, y in zip(xs, ys)], [by_level[x][2] - y for x, y in zip(xs, ys)]]
            ax.errorbar(xs, ys, yerr=yerr if any(map(any, yerr)) else None, capsize=3, marker="o",
                        linestyle="--" if fixed else "-", label=label)
    if not args.tpot:
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(args.floor, color="red", linewidth=0.8, linestyle=":", label=f"aim: {args.floor}x")
    ax.set_xscale("log")
    ax.set_xticks(sorted(levels), [str(x) for x in sorted(levels)])
    ax.set_xlabel("requests in flight (concurrency)")
    ax.set_ylabel("time per output token, ms" if args.tpot else "tokens/s ÷ no speculation")
    ax.set_title(("TPOT" if args.tpot else "Throughput") + " against load (dashed: fixed draft length)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
