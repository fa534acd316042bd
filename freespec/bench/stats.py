"""Rows of a run: per config x concurrency x category, throughput, vLLM's acceptance figures, the latency
figures of ``vllm bench serve`` (TTFT, TPOT, ITL: mean, p50, p90, p99), text identity with the baseline, and
with repeated samples the spread and the ratio interval."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from freespec.bench.configs import BASELINE

ALL_CATEGORIES = "all"
MIXED_CATEGORY = "mixed"  # the one block of all categories at concurrency > 1
LATENCY_PERCENTILES = (50, 90, 99)


def _ok(request: dict) -> bool:
    return not request.get("error")


def _combine_spec(a: dict[str, float] | None, b: dict[str, float] | None) -> dict[str, float] | None:
    if a is None:
        return None if b is None else dict(b)
    if b is None:
        return dict(a)
    return {key: a.get(key, 0.0) + b.get(key, 0.0) for key in set(a) | set(b)}


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default, as ``vllm bench serve``), None without values."""
    return float(np.percentile(values, q)) if len(values) else None


def latency_figures(requests: Sequence[dict]) -> dict[str, float | None]:
    """TTFT, TPOT and ITL of successful streamed requests in milliseconds: mean and percentiles, named as
    ``vllm bench serve`` names them (``mean_ttft_ms``, ``p99_itl_ms``, ...). TPOT is over requests with
    two or more output tokens; ITL pools every gap of every request."""
    values = {
        "ttft": [r["ttft_s"] for r in requests if r.get("ttft_s") is not None],
        "tpot": [r["tpot_s"] for r in requests if r.get("tpot_s") is not None],
        "itl": [gap for r in requests for gap in r.get("itl_s") or ()],
    }
    figures: dict[str, float | None] = {}
    for name, seconds in values.items():
        ms = [1000.0 * v for v in seconds]
        figures[f"mean_{name}_ms"] = float(np.mean(ms)) if ms else None
        for q in LATENCY_PERCENTILES:
            figures[f"p{q}_{name}_ms"] = percentile(ms, q)
    return figures


def block_metrics(requests: Sequence[dict], wall_s: float, spec: dict[str, float] | None) -> dict[str, Any]:
    """Metrics of one block (or of several blocks pooled: summed wall time and counters).

    - tok_per_s: completion tokens of the successful requests / wall time.
    - mean_acceptance_length: 1 + accepted / drafts (vLLM's definition; steps with drafts only).
    - acceptance_rate: accepted / draft tokens.
    - tokens_per_forward: completion tokens / target forward passes. Streamed requests count their
      forwards as vLLM streams them, a chunk per engine step after the opening role chunk (the length of
      ``itl_s``); otherwise completion tokens - accepted (each forward yields one token plus its accepted
      drafts), which reads high where drafts run past a request's end: vLLM counts a draft accepted past
      ``max_tokens`` or a stop although the output drops it. 1.0 without speculation.
    """
    ok = [r for r in requests if _ok(r)]
    tokens = sum(int(r.get("completion_tokens") or 0) for r in ok)
    latencies = [float(r["latency_s"]) for r in ok if r.get("latency_s") is not None]
    row: dict[str, Any] = {
        "num_requests": len(requests),
        "num_errors": len(requests) - len(ok),
        "completion_tokens": tokens,
        "wall_s": wall_s,
        "tok_per_s": tokens / wall_s if wall_s > 0 else None,
        "mean_latency_s": sum(latencies) / len(latencies) if latencies else None,
        "p50_latency_s": percentile(latencies, 50),
        "p90_latency_s": percentile(latencies, 90),
        "p99_latency_s": percentile(latencies, 99),
        **latency_figures(ok),
        "num_drafts": None,
        "num_draft_tokens": None,
        "num_accepted_tokens": None,
        "mean_acceptance_length": None,
        "acceptance_rate": None,
        "tokens_per_forward": None,
    }
    accepted = 0.0
    if spec is not None:
        drafts = spec.get("num_drafts", 0.0)
        draft_tokens = spec.get("num_draft_tokens", 0.0)
        accepted = spec.get("num_accepted_tokens", 0.0)
        row.update(num_drafts=drafts, num_draft_tokens=draft_tokens, num_accepted_tokens=accepted)
        if drafts > 0:
            row["mean_acceptance_length"] = 1.0 + accepted / drafts
        if draft_tokens > 0:
            row["acceptance_rate"] = accepted / draft_tokens
    streamed = [len(r.get("itl_s") or ()) for r in ok if int(r.get("completion_tokens") or 0) > 0]
    forwards = sum(streamed) if streamed and all(streamed) else tokens - accepted
    if tokens > 0 and forwards > 0:
        row["tokens_per_forward"] = tokens / forwards
    return row


def source_figures(blocks: Sequence[tuple[dict | None, float]]) -> dict[str, dict[str, float | None]] | None:
    """freespec's per-source counters summed over blocks, given as (counter deltas, wall seconds): draft and
    accepted tokens per source, their acceptance rate, the source's seconds and their share of the blocks'
    wall time (at concurrency 1, the share of the target's step time the source costs); None when no block
    has them (no freespec plugin on the server)."""
    known = [(d, wall) for d, wall in blocks if d is not None]
    if not known:
        return None
    wall = sum(w for _, w in known)
    totals: dict[str, dict[str, float | None]] = {}
    for delta, _ in known:
        for source, counts in delta.items():
            row = totals.setdefault(source, {"draft_tokens": 0.0, "accepted_tokens": 0.0, "seconds": 0.0})
            for key in ("draft_tokens", "accepted_tokens", "seconds"):
                row[key] += counts.get(key, 0.0)
    for row in totals.values():
        row["acceptance_rate"] = row["accepted_tokens"] / row["draft_tokens"] if row["draft_tokens"] else None
        row["time_share"] = row["seconds"] / wall if wall > 0 else None
    return totals


def sample_of(record: dict) -> tuple[int, int]:
    """(round, repeat) of a request or block; records without them (one measurement) are (0, 0)."""
    return int(record.get("round", 0)), int(record.get("repeat", 0))


def text_match(requests: Sequence[dict], baseline: Sequence[dict]) -> tuple[int, int]:
    """(identical, compared): outputs equal to the baseline's for the same question.

    With repeats, the baseline's reference output of a question is its earliest sample's (round,
    repeat) that succeeded; every repeat of ``requests`` is compared with it. When ``requests`` are
    the baseline's own, the reference requests themselves are skipped, so the baseline's later
    repeats are checked against its first. Only questions answered without error by both sides count.
    """
    reference: dict[Any, dict] = {}
    for r in sorted((r for r in baseline if _ok(r)), key=sample_of):
        reference.setdefault(r["question_id"], r)
    compared = identical = 0
    for r in requests:
        ref = reference.get(r["question_id"])
        if not _ok(r) or ref is None or ref is r:
            continue
        compared += 1
        identical += int(r.get("output") == ref.get("output"))
    return identical, compared


def combine_samples(samples: Sequence[dict[str, Any]], requests: Sequence[dict], spec: dict | None) -> dict:
    """One row from the per-sample metrics of a config x concurrency x category.

    ``tok_per_s`` is the mean of the samples' tokens/s, with ``tok_per_s_min`` / ``_max``; counts,
    wall time and vLLM's counters are summed over the samples, so acceptance figures and tokens per
    forward are ratios of totals; latency percentiles are over every request. With one sample the row
    is that sample's ``block_metrics``.
    """
    row = block_metrics(requests, sum(s["wall_s"] for s in samples), spec)
    rates = [s["tok_per_s"] for s in samples]
    known = [r for r in rates if r is not None]
    row["tok_per_s"] = sum(known) / len(known) if known and len(known) == len(rates) else None
    row["tok_per_s_min"] = min(known) if row["tok_per_s"] is not None else None
    row["tok_per_s_max"] = max(known) if row["tok_per_s"] is not None else None
    row["samples"] = len(samples)
    row["per_sample"] = [
        {key: s[key] for key in ("round", "repeat", "tok_per_s", "wall_s", "completion_tokens", "num_errors",
                                 "mean_acceptance_length", "acceptance_rate", "tokens_per_forward")}
        for s in samples
    ]
    return row


def ratio_interval(row: dict, base: dict) -> tuple[float | None, float | None]:
    """(low, high) bounds of ``row``'s ratio to ``base``: its slowest sample over the baseline's fastest,
    its fastest over the baseline's slowest. (None, None) unless both sides have two or more samples:
    one sample says nothing about noise."""
    if row.get("samples", 1) < 2 or base.get("samples", 1) < 2:
        return None, None
    lo, hi = row["tok_per_s_min"], row["tok_per_s_max"]
    base_lo, base_hi = base["tok_per_s_min"], base["tok_per_s_max"]
    if None in (lo, hi) or not base_lo or not base_hi:
        return None, None
    return lo / base_hi, hi / base_lo


def aggregate(
    requests: Sequence[dict], blocks: Sequence[dict], baseline: str = BASELINE
) -> list[dict[str, Any]]:
    """Rows per config x concurrency x category, plus an ``all`` row per config x concurrency.

    ``requests``: dicts with config, concurrency, category, question_id, output,
    completion_tokens, latency_s, error, and with repeats ``round`` and ``repeat``. ``blocks``: dicts
    with config, concurrency, category, wall_s, spec (counter deltas or None), round, repeat.

    A sample is one (round, repeat): one pass over a block. Each sample gets its own metrics (the
    ``all`` one pools that sample's category blocks); the row combines the samples (combine_samples).
    ``sources``: freespec's per-source counters of the row's blocks, summed, and each source's share of their
    wall time (source_figures).
    Each row adds ``ratio`` (mean tok/s over the baseline's mean at the same concurrency and category),
    ``ratio_low`` / ``ratio_high`` (ratio_interval), each sample's ratio to the baseline's same sample,
    and ``text_match`` / ``text_compared`` against the baseline's outputs (text_match; on the baseline's
    own rows: its later repeats against its first, None with one sample).
    """
    grouped: dict[tuple, list[dict]] = {}
    for r in requests:
        grouped.setdefault((r["config"], r["concurrency"], r["category"], sample_of(r)), []).append(r)

    # (config, concurrency, category) -> {sample: (metrics, requests, spec)}, in first-seen order.
    cells: OrderedDict[tuple, OrderedDict[tuple, tuple[dict, list, dict | None]]] = OrderedDict()
    pooled: OrderedDict[tuple, OrderedDict[tuple, dict[str, Any]]] = OrderedDict()
    for block in blocks:
        sample = sample_of(block)
        key = (block["config"], block["concurrency"], block["category"])
        reqs = grouped.get((*key, sample), [])
        metrics = block_metrics(reqs, block["wall_s"], block.get("spec"))
        cells.setdefault(key, OrderedDict())[sample] = ({"round": sample[0], "repeat": sample[1], **metrics},
                                                        reqs, block.get("spec"))
        pool = pooled.setdefault((key[0], key[1]), OrderedDict()).setdefault(
            sample, {"wall_s": 0.0, "spec": None, "requests": []})
        pool["wall_s"] += block["wall_s"]
        pool["spec"] = _combine_spec(pool["spec"], block.get("spec"))
        pool["requests"].extend(reqs)
    for (config, concurrency), per_sample in pooled.items():
        cells[(config, concurrency, ALL_CATEGORIES)] = OrderedDict(
            (sample, ({"round": sample[0], "repeat": sample[1],
                       **block_metrics(p["requests"], p["wall_s"], p["spec"])}, p["requests"], p["spec"]))
            for sample, p in per_sample.items())

    rows: list[dict[str, Any]] = []
    for (config, concurrency, category), per_sample in cells.items():
        samples = [m for m, _, _ in per_sample.values()]
        reqs = [r for _, rs, _ in per_sample.values() for r in rs]
        spec = None
        for _, _, s in per_sample.values():
            spec = _combine_spec(spec, s)
        rows.append({"config": config, "concurrency": concurrency, "category": category, "_requests": reqs,
                     **combine_samples(samples, reqs, spec)})

    index = {(r["config"], r["concurrency"], r["category"]): r for r in rows}
    for row in rows:
        base = index.get((baseline, row["concurrency"], row["category"]))
        row["ratio"] = row["ratio_low"] = row["ratio_high"] = None
        row["text_match"] = None
        row["text_identical"] = None
        row["text_compared"] = None
        base_by_sample = {(s["round"], s["repeat"]): s for s in base["per_sample"]} if base else {}
        for s in row["per_sample"]:
            b = base_by_sample.get((s["round"], s["repeat"]))
            s["ratio"] = (s["tok_per_s"] / b["tok_per_s"]
                          if row["config"] != baseline and b and s["tok_per_s"] is not None and b["tok_per_s"]
                          else None)
        if base is None:
            continue
        identical, compared = text_match(row["_requests"], base["_requests"])
        if row["config"] != baseline:
            if row["tok_per_s"] is not None and base["tok_per_s"]:
                row["ratio"] = row["tok_per_s"] / base["tok_per_s"]
                row["ratio_low"], row["ratio_high"] = ratio_interval(row, base)
        elif not compared:
            continue  # the baseline with one sample: nothing to compare it with
        row["text_identical"], row["text_compared"] = identical, compared
        row["text_match"] = identical / compared if compared else None
    for row in rows:
        del row["_requests"]
        row["sources"] = source_figures([
            (b.get("sources"), b["wall_s"]) for b in blocks
            if (b["config"], b["concurrency"]) == (row["config"], row["concurrency"])
            and row["category"] in (ALL_CATEGORIES, b["category"])])
    return rows
