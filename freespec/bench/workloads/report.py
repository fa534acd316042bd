"""results.md of a workload run: a table per workload (its first pass and each repeated-traffic pass as
rows of each config), then one over every workload (``all``)."""
from __future__ import annotations

from collections.abc import Sequence

from freespec.bench.configs import BASELINE
from freespec.bench.report import match_note, render_markdown
from freespec.bench.stats import ALL_CATEGORIES
from freespec.bench.workloads.session import Workload

PASS_NOTES = {
    "same": "the same sessions again on the same server",
    "restart": "the same sessions again after the server was stopped and started (what persisted)",
    "replica": "the same sessions again on a second server of the same config (what replicas share)",
    "tenant": "the same sessions again on the same server from another tenant (another cache_salt): what one "
              "tenant's traffic gives another",
    "cold-tenant": "the same sessions from a third tenant on a second, fresh server that first served as many "
                   "sessions of other material as the first tenant: the tenant row's reference (what another "
                   "tenant gets, had the first never asked these)",
}


def pass_category(workload: str, mode: str | None) -> str:
    """The category (table row) of a workload's pass: its name, or ``name · mode`` for a repeated pass."""
    return workload if mode is None else f"{workload} · {mode}"


def workload_categories(workload: str, modes: Sequence[str]) -> list[str]:
    return [pass_category(workload, None), *(pass_category(workload, m) for m in modes)]


def render_workload_tables(rows: Sequence[dict], workloads: Sequence[Workload], modes: Sequence[str],
                           failures: Sequence[tuple[str, str]] = (), dtype: str | None = None,
                           baseline: str = BASELINE) -> str:
    """A section per workload (skipped ones say why), each with its table; then the ``all`` table; then the
    match note once (bfloat16, float16)."""
    parts = []
    for w in workloads:
        passes = "".join(f" `{pass_category(w.name, m)}`: {PASS_NOTES[m]}." for m in modes)
        if "tenant" in modes:
            passes += (f" `{pass_category(w.name, 'tenant')}` ran right after the first pass.")
        if set(modes) & {"tenant", "cold-tenant"}:
            passes += " Every other pass was sent as the first tenant."
        count = len(w.sessions)
        parts.append(f"## {w.name}\n\n{w.description}; {count} session{'' if count == 1 else 's'}.")
        if w.skipped:
            parts.append(f"\n\nskipped: {w.skipped}\n\n")
            continue
        categories = workload_categories(w.name, modes)
        table_rows = [r for r in rows if r["category"] in categories]
        parts.append((passes and " Rows:" + passes) + "\n\n")
        parts.append(render_markdown(table_rows, baseline, failures, dtype, note=False) + "\n")
    overall = [r for r in rows if r["category"] == ALL_CATEGORIES]
    if overall:
        parts.append("## All workloads\n\nEvery workload and pass of a config at a load, pooled.\n\n")
        parts.append(render_markdown(overall, baseline, (), dtype, note=False))
    note = match_note(dtype)
    return "".join(parts) + ("\n" + note if note else "")
