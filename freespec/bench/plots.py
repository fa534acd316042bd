"""The run's charts (matplotlib, the ``bench`` extra): ``results.png``, each config's speed-up over the
baseline at each load with its interval; ``results_tpot.png``, time per output token against load.
Both read the ``all`` rows (every category of a load level pooled)."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from freespec.bench.configs import BASELINE
from freespec.bench.report import ordered_keys
from freespec.bench.stats import ALL_CATEGORIES


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _all_rows(rows: Sequence[dict]) -> dict[tuple, dict]:
    return {(r["config"], r["concurrency"]): r for r in rows if r["category"] == ALL_CATEGORIES}


def plot_speedup(rows: Sequence[dict], path: Path, baseline: str = BASELINE, title: str | None = None) -> bool:
    """Grouped bars, one group per load level, one bar per config: tok/s over the baseline's; error bars
    span the ratio interval (ratio_low to ratio_high) where a row was measured more than once.

    Returns False (and writes nothing) when there is nothing to compare.
    """
    configs, concurrencies, _ = ordered_keys(rows)
    configs = [c for c in configs if c != baseline]
    index = _all_rows(rows)
    if not configs or not any(index.get((c, n), {}).get("ratio") is not None for c in configs for n in concurrencies):
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(concurrencies) * len(configs) ** 0.5 + 3) + 3, 4.2))
    width = 0.8 / len(configs)
    for i, config in enumerate(configs):
        values, below, above = [], [], []
        for concurrency in concurrencies:
            row = index.get((config, concurrency)) or {}
            value, low, high = row.get("ratio"), row.get("ratio_low"), row.get("ratio_high")
            values.append(float("nan") if value is None else value)
            below.append(value - low if value is not None and low is not None else 0.0)
            above.append(high - value if value is not None and high is not None else 0.0)
        xs = [x + (i - (len(configs) - 1) / 2) * width for x in range(len(concurrencies))]
        errors = {"yerr": [below, above], "capsize": 3} if any(below) or any(above) else {}
        bars = ax.bar(xs, values, width=width, label=config, **errors)
        ax.bar_label(bars, fmt="%.2f", fontsize="x-small", padding=2)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(concurrencies)))
    ax.set_xticklabels([str(c) for c in concurrencies])
    ax.set_xlabel("requests in flight (concurrency)")
    ax.set_ylabel(f"tok/s ÷ {baseline}")
    ax.set_title(title or f"speed-up over {baseline}")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_tpot(rows: Sequence[dict], path: Path, title: str | None = None) -> bool:
    """One line per config (the baseline included): mean time per output token against load, the band
    from its p50 to its p90. Returns False (and writes nothing) without TPOT figures."""
    configs, concurrencies, _ = ordered_keys(rows)
    concurrencies = sorted(concurrencies)
    index = _all_rows(rows)
    if not any(index.get((c, n), {}).get("mean_tpot_ms") is not None for c in configs for n in concurrencies):
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.2))
    for config in configs:
        points = [(n, index[(config, n)]) for n in concurrencies
                  if index.get((config, n), {}).get("mean_tpot_ms") is not None]
        if not points:
            continue
        xs = [n for n, _ in points]
        line, = ax.plot(xs, [r["mean_tpot_ms"] for _, r in points], marker="o", label=config)
        low = [r.get("p50_tpot_ms") for _, r in points]
        high = [r.get("p90_tpot_ms") for _, r in points]
        if None not in low and None not in high:
            ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.15)
    if len(concurrencies) > 2:
        ax.set_xscale("log")
    ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
    ax.set_xlabel("requests in flight (concurrency)")
    ax.set_ylabel("time per output token, ms (band: p50–p90)")
    ax.set_title(title or "TPOT against load")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def draw_charts(rows: Sequence[dict], out: Path, model: str, dtype: str | None) -> None:
    """``results.png`` (speed-up over the baseline) and ``results_tpot.png`` in ``out``, each path printed; a
    chart that cannot be drawn is said on stderr and never loses the results."""
    import sys

    title = f"{Path(model).name} ({dtype})" if dtype else Path(model).name
    charts = ((plot_speedup, "results.png", f"speed-up over {BASELINE}: {title}"),
              (plot_tpot, "results_tpot.png", f"time per output token: {title}"))
    for plot, name, chart_title in charts:
        try:
            if plot(rows, out / name, title=chart_title):
                print(f"plot: {out / name}")
        except Exception as exc:  # noqa: BLE001 - a plot failure must not lose the results
            print(f"freespec bench: could not draw {name}: {exc}", file=sys.stderr)
