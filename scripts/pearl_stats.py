"""Summarise the ``pearl`` stats lines of a vLLM server log: where the time went, per load level.

``PearlProposer`` logs its cumulative counters (``freespec: pearl {...}``) every
``FREESPEC_STATS_INTERVAL_S`` seconds, and once more when it is closed. ``freespec bench``
keeps each server's log; with ``FREESPEC_STATS_INTERVAL_S=2`` the difference between two
consecutive lines covers two seconds of serving. A window whose steps had one row each ran
one request at a time (concurrency 1, warm-up included); the others ran several. Summing
the windows of each kind gives, per step:

- ``target_wait_ms``: how long ``propose()`` blocked, i.e. the target waited for drafts;
- ``draft_idle_ms``: how long the draft had nothing to do, i.e. it waited for the target;
- ``hits`` / ``partial`` / ``misses`` / ``deferred`` per step, and the synchronous and
  background forward passes per step.

    python scripts/pearl_stats.py bench_results/RUN/server_pearl_....log
"""
from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

LINE = re.compile(r"freespec: pearl (?:final stats )?(\{.*\})\s*$")
COUNTERS = ("steps", "rows", "step_wait", "idle", "in_flight_wait", "step_work", "background", "hits", "partial",
            "misses", "deferred", "refused", "sync_forwards", "background_forwards", "chains", "chain_tokens",
            "deaths", "skipped_steps")


def read_stats(text: str) -> list[dict]:
    """Every stats dict in a log, in order (restarts of the server start again from zero)."""
    out = []
    for line in text.splitlines():
        m = LINE.search(line)
        if m:
            try:
                out.append(ast.literal_eval(m.group(1)))  # a dict of numbers and strings, never code
            except (ValueError, SyntaxError):
                continue
    return out


def windows(stats: list[dict]) -> list[dict]:
    """Differences of the counters between consecutive lines of one server (fewer steps: a new server).

    A server's first line is left out: it counts from the proposer's construction, so its ``idle``
    holds the draft's wait while vLLM loaded and compiled the target.
    """
    out, prev = [], None
    for b in stats:
        cur = {name: b.get(name, 0) for name in COUNTERS}
        if prev is not None and cur["steps"] >= prev["steps"]:
            d = {name: cur[name] - prev[name] for name in COUNTERS}
            if d["steps"] > 0:
                out.append(d)
        prev = cur
    return out


def summarise(stats: list[dict]) -> dict:
    """Per-step figures for windows of one row per step (``"c1"``) and of several (``"batched"``)."""
    groups: dict[str, dict] = {}
    for w in windows(stats):
        kind = "c1" if w["rows"] <= w["steps"] else "batched"
        g = groups.setdefault(kind, dict.fromkeys(COUNTERS, 0))
        for name in COUNTERS:
            g[name] += w[name]
    result = {}
    for kind, g in groups.items():
        steps = g["steps"]
        result[kind] = {
            "steps": steps,
            "rows_per_step": round(g["rows"] / steps, 2),
            "target_wait_ms": round(1000 * g["step_wait"] / steps, 2),
            "in_flight_wait_ms": round(1000 * g["in_flight_wait"] / steps, 2),
            "draft_idle_ms": round(1000 * g["idle"] / steps, 2),
            "draft_background_ms": round(1000 * g["background"] / steps, 2),
            "hits_per_row": round(g["hits"] / max(1, g["rows"]), 3),
            "partial_per_row": round(g["partial"] / max(1, g["rows"]), 3),
            "misses_per_row": round(g["misses"] / max(1, g["rows"]), 3),
            "deferred_per_row": round(g["deferred"] / max(1, g["rows"]), 3),
            "sync_forwards_per_step": round(g["sync_forwards"] / steps, 2),
            "background_forwards_per_step": round(g["background_forwards"] / steps, 2),
            "mean_chain": round(g["chain_tokens"] / max(1, g["chains"]), 2),
            "deaths": g["deaths"],
            "skipped_steps": g["skipped_steps"],
        }
    return result


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    for path in argv:
        stats = read_stats(Path(path).read_text(errors="replace"))
        print(json.dumps({"log": path, "lines": len(stats), **summarise(stats)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
