"""vLLM's ``/metrics`` text: samples by metric name, and the speculative-decoding counters the benchmark reads.

Parsing is ``prometheus_client``'s (vLLM's own dependency; the ``bench`` extra brings it for a client-only
install measuring a remote server), imported when first needed so that ``freespec`` starts without it.
"""
from __future__ import annotations

Samples = dict[str, list[tuple[dict[str, str], float]]]

# Counters that vLLM's Prometheus endpoint exposes when speculation is on
# (vllm/v1/spec_decode/metrics.py); prometheus_client appends ``_total``.
SPEC_COUNTERS = {
    "num_drafts": "vllm:spec_decode_num_drafts_total",
    "num_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
}


# freespec's own counters (freespec.vllm_plugins.metrics), labelled by plugin and source: which source of a
# plugin supplied the draft tokens, how many of them the target accepted, and the seconds each source took.
SOURCE_COUNTERS = {
    "draft_tokens": "freespec:draft_tokens_total",
    "accepted_tokens": "freespec:accepted_tokens_total",
    "seconds": "freespec:source_seconds_total",
}

SourceCounts = dict[str, dict[str, float]]


def parse_prometheus_text(text: str) -> Samples:
    """``{sample name: [(labels, value), ...]}`` of Prometheus text; ValueError when it is not that format."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: Samples = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    except (ValueError, IndexError, TypeError) as exc:
        raise ValueError(f"the metrics text is not in Prometheus' text format: {exc}") from None
    return samples


def sum_metric(samples: Samples, name: str) -> float | None:
    """Sum of a metric over all its label sets (engines, model names); None if absent."""
    if name not in samples:
        return None
    return float(sum(value for _, value in samples[name]))


def spec_counters(metrics_text: str) -> dict[str, float] | None:
    """The three speculative-decoding counters from ``/metrics`` text.

    None when the server exposes none of them (no speculation configured).
    """
    return spec_counters_of(parse_prometheus_text(metrics_text))


def spec_counters_of(samples: Samples) -> dict[str, float] | None:
    """``spec_counters`` of parsed samples."""
    values = {key: sum_metric(samples, name) for key, name in SPEC_COUNTERS.items()}
    if all(v is None for v in values.values()):
        return None
    return {key: (v or 0.0) for key, v in values.items()}


def counter_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    """``after - before`` per counter; None when the server has no such counters."""
    if after is None:
        return None
    before = before or {}
    return {key: after[key] - before.get(key, 0.0) for key in after}


def source_counters(samples: Samples) -> SourceCounts | None:
    """``{source: {"draft_tokens": n, "accepted_tokens": n}}`` summed over plugins and processes; None when
    the server exposes no freespec counters (no freespec plugin, or an older freespec)."""
    if not any(name in samples for name in SOURCE_COUNTERS.values()):
        return None
    out: SourceCounts = {}
    for key, name in SOURCE_COUNTERS.items():
        for labels, value in samples.get(name, ()):
            counts = out.setdefault(labels.get("source", ""), dict.fromkeys(SOURCE_COUNTERS, 0.0))
            counts[key] += value
    return out


def source_delta(before: SourceCounts | None, after: SourceCounts | None) -> SourceCounts | None:
    """``after - before`` per source and counter; None without counters after."""
    if after is None:
        return None
    before = before or {}
    return {source: {key: value - before.get(source, {}).get(key, 0.0) for key, value in counts.items()}
            for source, counts in after.items()}
