"""vLLM's /metrics text: parsing (prometheus_client's) and the speculative-decoding counters."""
from __future__ import annotations

import math

import pytest

from freespec.bench import prometheus

METRICS_NONE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 512.0
"""

METRICS_SPEC = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 120.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 30.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
vllm:spec_decode_num_drafts_created 1.7e9
"""


# ---------------------------------------------------------------- Prometheus


def test_parse_prometheus_labels_values_and_comments():
    text = (
        '# HELP x help text with "quotes"\n'
        "\n"
        'a_metric{path="/v1/chat",le="+Inf"} 3\n'
        'a_metric{path="/health",le="0.5"} 1.5e2 1700000000000\n'
        'weird{msg="a \\"quoted\\" }, value",x="back\\\\slash"} NaN\n'
        "bare_total 7\n"
        'inf_metric{a="b",} +Inf\n'
    )
    samples = prometheus.parse_prometheus_text(text)
    assert samples["a_metric"] == [
        ({"path": "/v1/chat", "le": "+Inf"}, 3.0),
        ({"path": "/health", "le": "0.5"}, 150.0),
    ]
    (labels, value), = samples["weird"]
    assert labels == {"msg": 'a "quoted" }, value', "x": "back\\slash"}
    assert math.isnan(value)
    assert samples["bare_total"] == [({}, 7.0)]
    assert samples["inf_metric"] == [({"a": "b"}, math.inf)]
    assert "x" not in samples  # comment lines are not samples


def test_parse_prometheus_rejects_garbage():
    with pytest.raises(ValueError, match="not in Prometheus' text format"):
        prometheus.parse_prometheus_text("ok 1\nthis is not a sample line at all\n")


def test_sum_metric_sums_label_sets_and_reports_absence():
    samples = prometheus.parse_prometheus_text(METRICS_SPEC)
    assert prometheus.sum_metric(samples, "vllm:spec_decode_num_drafts_total") == 15.0
    assert prometheus.sum_metric(samples, "vllm:nope") is None


def test_spec_counters_from_metrics_text():
    assert prometheus.spec_counters(METRICS_SPEC) == {
        "num_drafts": 15.0,
        "num_draft_tokens": 120.0,
        "num_accepted_tokens": 30.0,
    }
    # A server without speculation exposes none of the counters.
    assert prometheus.spec_counters(METRICS_NONE) is None


def test_counter_delta():
    before = {"num_drafts": 10.0, "num_draft_tokens": 80.0, "num_accepted_tokens": 20.0}
    after = {"num_drafts": 14.0, "num_draft_tokens": 112.0, "num_accepted_tokens": 29.0}
    assert prometheus.counter_delta(before, after) == {
        "num_drafts": 4.0, "num_draft_tokens": 32.0, "num_accepted_tokens": 9.0,
    }
    assert prometheus.counter_delta(None, after) == after
    assert prometheus.counter_delta(None, None) is None



METRICS_SOURCES = """\
# TYPE freespec:draft_tokens counter
freespec:draft_tokens_total{plugin="hybrid",source="copy"} 60.0
freespec:draft_tokens_total{plugin="hybrid",source="recycle"} 20.0
freespec:draft_tokens_total{plugin="copy",source="copy"} 5.0
# TYPE freespec:accepted_tokens counter
freespec:accepted_tokens_total{plugin="hybrid",source="copy"} 30.0
# TYPE freespec:source_seconds counter
freespec:source_seconds_total{plugin="hybrid",source="copy"} 1.5
freespec:source_seconds_total{plugin="hybrid",source="hybrid"} 0.25
"""


def test_source_counters_sum_plugins_per_source():
    counts = prometheus.source_counters(prometheus.parse_prometheus_text(METRICS_SOURCES))
    assert counts == {"copy": {"draft_tokens": 65.0, "accepted_tokens": 30.0, "seconds": 1.5},
                      "recycle": {"draft_tokens": 20.0, "accepted_tokens": 0.0, "seconds": 0.0},
                      "hybrid": {"draft_tokens": 0.0, "accepted_tokens": 0.0, "seconds": 0.25}}
    # vLLM's counters only (no freespec plugin): no per-source figures.
    assert prometheus.source_counters(prometheus.parse_prometheus_text(METRICS_SPEC)) is None


def test_source_delta_counts_sources_that_appeared_meanwhile():
    before = {"copy": {"draft_tokens": 10.0, "accepted_tokens": 4.0}}
    after = {"copy": {"draft_tokens": 16.0, "accepted_tokens": 7.0},
             "recycle": {"draft_tokens": 2.0, "accepted_tokens": 1.0}}
    assert prometheus.source_delta(before, after) == {"copy": {"draft_tokens": 6.0, "accepted_tokens": 3.0},
                                                      "recycle": {"draft_tokens": 2.0, "accepted_tokens": 1.0}}
    assert prometheus.source_delta(None, None) is None
