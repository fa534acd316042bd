"""results.md: the table per config x category with a column group per load, the latency table, and the
header that says how to read them."""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from freespec.bench.configs import BASELINE
from freespec.bench.stats import ALL_CATEGORIES, LATENCY_PERCENTILES


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return format(value, spec)


def ordered_keys(rows: Sequence[dict]) -> tuple[list[str], list[Any], list[str]]:
    """Configs, concurrencies and categories in first-seen order (``all`` last)."""
    configs = list(OrderedDict.fromkeys(r["config"] for r in rows))
    concurrencies = list(OrderedDict.fromkeys(r["concurrency"] for r in rows))
    categories = list(OrderedDict.fromkeys(r["category"] for r in rows if r["category"] != ALL_CATEGORIES))
    if any(r["category"] == ALL_CATEGORIES for r in rows):
        categories.append(ALL_CATEGORIES)
    return configs, concurrencies, categories


def half_range(low: float | None, high: float | None) -> float | None:
    """Half the distance between the slowest and the fastest sample: the ``±`` of the table."""
    return None if low is None or high is None else (high - low) / 2


# Dtypes in which greedy text is not expected to be the same across batch shapes (issue 53).
HALF_DTYPES = ("bfloat16", "float16", "half", "bf16", "fp16")


def half_precision(dtype: str | None) -> bool:
    return str(dtype or "").lower() in HALF_DTYPES


def match_note(dtype: str | None) -> str:
    """What the match column can say in ``dtype``: in bfloat16 or float16 any change of batch shape (another
    load, a config's draft tokens in the batch) changes greedy text with or without speculation; empty in
    float32 (and for an unknown dtype)."""
    if not half_precision(dtype):
        return ""
    return (f"\\* match in {dtype}: any change of batch shape changes greedy text, with or without speculation, "
            "so a mismatch here says nothing about a config; run with `--dtype float32` for an identity check.\n")


def failure_rows(configs: Sequence[dict]) -> list[tuple[str, str]]:
    """(label, what happened) of each config whose server died or failed to start (results.json's
    ``configs``: ``server died: AssertionError in propose (...)``), once per distinct text."""
    seen: list[tuple[str, str]] = []
    for c in configs:
        if c.get("status") != "failed":
            continue
        text = c.get("failure") or "server died: " + str(c.get("note") or "failed").split("; see ")[0]
        if (c["label"], text) not in seen:
            seen.append((c["label"], text))
    return seen


def render_markdown(rows: Sequence[dict], baseline: str = BASELINE, failures: Sequence[tuple[str, str]] = (),
                    dtype: str | None = None, note: bool = True) -> str:
    """Markdown table: a row per config x category, a column group per concurrency.

    A row measured more than once shows tok/s as ``mean ±half-range`` and the ratio as
    ``ratio (low–high)`` (ratio_interval); one measurement shows plain values. ``failures``: (label, what
    happened) of configs whose server died or never started (``failure_rows``), a row each saying so. In bfloat16 or float16 ``dtype``,
    the match column is starred and (with ``note``) the table is followed by ``match_note``.
    """
    configs, concurrencies, categories = ordered_keys(rows)
    index = {(r["config"], r["concurrency"], r["category"]): r for r in rows}
    match = "match*" if half_precision(dtype) else "match"
    columns = ("tok/s", f"×{baseline}", "acc len", "acc rate", "tok/fwd", match, "p50/p90 s")
    header = ["config", "category"] + [f"c={c} {col}" for c in concurrencies for col in columns]
    rule = "|" + "|".join(["---", "---"] + ["---:"] * (len(header) - 2)) + "|"
    lines = ["| " + " | ".join(header) + " |", rule]
    for config in configs:
        for category in categories:
            if not any((config, c, category) in index for c in concurrencies):
                continue
            cells = [config.replace("|", "\\|"), category]
            for c in concurrencies:
                row = index.get((config, c, category))
                if row is None:
                    cells += ["–"] * len(columns)
                    continue
                tok_s = _fmt(row["tok_per_s"], ".1f")
                ratio = _fmt(row["ratio"], ".2f")
                if row.get("samples", 1) > 1:
                    tok_s += f' ±{_fmt(half_range(row["tok_per_s_min"], row["tok_per_s_max"]), ".1f")}'
                    if row.get("ratio_low") is not None:
                        ratio += f' ({row["ratio_low"]:.2f}–{row["ratio_high"]:.2f})'
                if row.get("num_errors"):
                    tok_s += f" ({row['num_errors']} err)"
                match = "–"
                if row.get("text_compared"):
                    match = f"{row['text_identical']}/{row['text_compared']}"
                cells += [
                    tok_s,
                    ratio,
                    _fmt(row["mean_acceptance_length"], ".2f"),
                    _fmt(row["acceptance_rate"], ".1%"),
                    _fmt(row["tokens_per_forward"], ".2f"),
                    match,
                    f'{_fmt(row.get("p50_latency_s"), ".1f")}/{_fmt(row.get("p90_latency_s"), ".1f")}',
                ]
            lines.append("| " + " | ".join(cells) + " |")
    for label, what in failures:
        died = what.replace("|", "\\|")
        lines.append("| " + " | ".join([label.replace("|", "\\|"), died] + ["–"] * (len(header) - 2)) + " |")
    return "\n".join(lines) + "\n" + ("\n" + match_note(dtype) if note and match_note(dtype) else "")


def repeats_note(repeats: int, rounds: int) -> str:
    """The results.md header's sentence on reading the spread, for more than one sample."""
    how = " × ".join(part for part in (
        f"{rounds} rounds on fresh servers" if rounds > 1 else "",
        f"{repeats} repeats per server" if repeats > 1 else "") if part)
    return (f" Each block measured {repeats * rounds} times ({how}): tok/s is the mean ± half the range "
            f"of the samples; ×{BASELINE} is the ratio of the means, (low–high) the slowest sample over "
            f"{BASELINE}'s fastest to the fastest over {BASELINE}'s slowest; match counts every sample.")


def _ratio_text(row: dict) -> str:
    ratio = _fmt(row.get("ratio"), ".2f")
    if row.get("ratio_low") is not None:
        ratio += f' ({row["ratio_low"]:.2f}–{row["ratio_high"]:.2f})'
    return ratio


def render_latency_markdown(rows: Sequence[dict], baseline: str = BASELINE) -> str:
    """Markdown table of the latency figures next to throughput: a row per config x concurrency over every
    category (``all``), TTFT / TPOT / ITL as ``vllm bench serve`` reports them (ms: mean, p50, p90, p99)."""
    configs, concurrencies, _ = ordered_keys(rows)
    index = {(r["config"], r["concurrency"]): r for r in rows if r["category"] == ALL_CATEGORIES}
    stats = "/".join(["mean", *(f"p{q}" for q in LATENCY_PERCENTILES)])
    header = ["config", "concurrency", "tok/s", f"×{baseline}",
              f"TTFT ms {stats}", f"TPOT ms {stats}", f"ITL ms {stats}"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---", "---:"] + ["---:"] * 5) + "|"]
    for config in configs:
        for c in concurrencies:
            row = index.get((config, c))
            if row is None:
                continue
            figures = ["/".join(_fmt(row.get(f"{k}_{name}_ms"), ".1f")
                                for k in ("mean", *(f"p{q}" for q in LATENCY_PERCENTILES)))
                       for name in ("ttft", "tpot", "itl")]
            cells = [config.replace("|", "\\|"), str(c), _fmt(row["tok_per_s"], ".1f"), _ratio_text(row), *figures]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_sources_markdown(rows: Sequence[dict]) -> str:
    """Markdown table of freespec's per-source counters: a row per config x concurrency over every category,
    each source's accepted / drafted tokens and rate, and its share of the wall time. Empty when no row has them."""
    configs, concurrencies, _ = ordered_keys(rows)
    index = {(r["config"], r["concurrency"]): r for r in rows
             if r["category"] == ALL_CATEGORIES and r.get("sources")}
    if not index:
        return ""
    lines = ["| config | concurrency | accepted / drafted tokens per source | proposer time, share of wall time |",
             "|---|---:|---|---|"]
    for config in configs:
        for c in concurrencies:
            row = index.get((config, c))
            if row is None:
                continue
            sources = sorted(row["sources"].items())
            parts = [f"{source or '–'} {counts['accepted_tokens']:.0f}/{counts['draft_tokens']:.0f}"
                     f" ({_fmt(counts['acceptance_rate'], '.0%')})" for source, counts in sources
                     if counts["draft_tokens"] or not counts.get("seconds")]
            shares = [counts.get("time_share") for _, counts in sources]
            total = sum(s for s in shares if s is not None) if any(s is not None for s in shares) else None
            times = [f"{source or '–'} {_fmt(counts.get('time_share'), '.2%')}" for source, counts in sources]
            time_cell = f"{_fmt(total, '.2%')} ({'; '.join(times)})"
            lines.append(f"| {config.replace('|', chr(92) + '|')} | {c} | {'; '.join(parts)} | {time_cell} |")
    return "\n".join(lines) + "\n"


SOURCES_HEADER = (
    "\n## Sources\n\nfreespec's own counters from `/metrics` (`freespec:draft_tokens`, `freespec:accepted_tokens`, "
    "`freespec:source_seconds`): which source of a plugin supplied the draft tokens, how many the target accepted, "
    "and the time each source took as a share of the blocks' wall time (at concurrency 1, of the target's step "
    "time; under the plugin's own name, its time outside its sources).\n\n"
)


def results_header(model: str, dtype: str | None, max_tokens: int, temperature: float, k: int | None, n_prompts: int,
                   questions: str, repeats: int, rounds: int, server: str | None = None,
                   machine: str | None = None, measured: str | None = None) -> str:
    """The first paragraph of results.md: what was measured and how to read the columns. ``server``: the
    URL of a server the run did not start (its engine settings, K included, are the server's own);
    ``machine``: the CPU the run's own servers ran on (``freespec.machine.machine_summary``)."""
    engine = f"server {server}, " if server else f"dtype {dtype}, "
    draft = f"num_speculative_tokens {k}, " if k is not None else ""
    return (
        f"# freespec bench\n\nmodel `{model}`, {engine}max_tokens {max_tokens}, "
        f"temperature {temperature}, {draft}"
        + (measured or f"{n_prompts} prompts from {questions}") + ". "
        + (f"Machine: {machine}. " if machine else "")
        + f"tok/s: completion tokens / block wall time; "
        f"×{BASELINE}: ratio to {BASELINE}; acc len: 1 + accepted/drafts; acc rate: accepted/draft tokens; "
        f"tok/fwd: tokens per target forward pass; match: outputs identical to {BASELINE}'s"
        + (" (not expected to hold when sampling, temperature > 0)" if temperature > 0 else "")
        + (f" (not expected to hold in {dtype}: see the note under the table)"
           if half_precision(dtype) and not server else "")
        + "." + (repeats_note(repeats, rounds) if repeats * rounds > 1 else "") + "\n\n"
    )


def state_backends(configs: Sequence[dict]) -> str:
    """A line naming where each config with a ``state_dir`` kept its learned state (``folder`` or ``redis``, with the
    URL its results record, password hidden), or ''."""
    seen: dict[str, str] = {}
    for c in configs:
        if c.get("state_backend"):
            where = (c.get("speculative_config") or {}).get("state_dir", "")
            seen.setdefault(c["label"], f"{c['state_backend']}" + (f" ({where})" if c["state_backend"] == "redis" else ""))
    if not seen:
        return ""
    return "Learned state (`state_dir`): " + "; ".join(f"{label}: {b}" for label, b in seen.items()) + ".\n\n"


LATENCY_HEADER = (
    "\n## Latency\n\nStreamed requests, all categories of a load level pooled; as `vllm bench serve` reports them: "
    "TTFT, time to the first token; TPOT, time per output token after the first; ITL, time between "
    "streamed chunks (a chunk may carry several accepted tokens).\n\n"
)
