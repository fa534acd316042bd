"""Rows of a run: throughput, acceptance, latency figures, text identity, repeats and ratio intervals."""
from __future__ import annotations

import pytest
from bench_helpers import repeated_run, req, synthetic_run

from freespec.bench import stats


def test_block_metrics_math():
    reqs = [req("ngram", 1, "a", 1, "x", 60), req("ngram", 1, "a", 2, "y", 40)]
    spec = {"num_drafts": 20.0, "num_draft_tokens": 160.0, "num_accepted_tokens": 40.0}
    m = stats.block_metrics(reqs, 4.0, spec)
    assert m["completion_tokens"] == 100
    assert m["tok_per_s"] == pytest.approx(25.0)
    assert m["mean_acceptance_length"] == pytest.approx(1 + 40 / 20)
    assert m["acceptance_rate"] == pytest.approx(40 / 160)
    assert m["tokens_per_forward"] == pytest.approx(100 / 60)


def test_streamed_requests_count_their_forwards_as_their_chunks():
    # vLLM counts drafts accepted past max_tokens: two requests of 16 tokens in 5 and 4 steps (a role chunk,
    # then a chunk a step) whose last drafts ran 6 and 4 tokens past the end read 31 accepted by the counters.
    reqs = [dict(req("hybrid", 1, "a", 1, "x", 16), itl_s=[0.1] * 5), dict(req("hybrid", 1, "a", 2, "y", 16),
                                                                          itl_s=[0.1] * 4)]
    spec = {"num_drafts": 7.0, "num_draft_tokens": 56.0, "num_accepted_tokens": 31.0}
    m = stats.block_metrics(reqs, 1.0, spec)
    assert m["tokens_per_forward"] == pytest.approx(32 / 9)  # not 32 / (32 - 31)
    # A record without chunk gaps (not streamed) falls back on the counters for the whole block.
    m = stats.block_metrics(reqs + [req("hybrid", 1, "a", 3, "z", 16)], 1.0, spec)
    assert m["tokens_per_forward"] == pytest.approx(48 / (48 - 31))


def test_block_metrics_without_speculation_and_with_errors():
    reqs = [req("none", 1, "a", 1, "x", 50), req("none", 1, "a", 2, None, 0, error="HTTP 400: too long")]
    m = stats.block_metrics(reqs, 2.0, None)
    assert m["num_errors"] == 1 and m["num_requests"] == 2
    assert m["tok_per_s"] == pytest.approx(25.0)
    assert m["mean_acceptance_length"] is None and m["acceptance_rate"] is None
    assert m["tokens_per_forward"] == pytest.approx(1.0)
    # Speculation configured but nothing ever drafted: no acceptance figures, 1 token per forward.
    zero = {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0}
    m = stats.block_metrics(reqs, 2.0, zero)
    assert m["mean_acceptance_length"] is None and m["acceptance_rate"] is None
    assert m["tokens_per_forward"] == pytest.approx(1.0)


def test_aggregate_ratios_text_match_and_all_rows():
    requests, blocks = synthetic_run()
    rows = stats.aggregate(requests, blocks)
    index = {(r["config"], r["concurrency"], r["category"]): r for r in rows}
    assert set(index) == {(c, 1, k) for c in ("none", "ngram") for k in ("a", "b", "all")}

    none_a, ngram_a = index[("none", 1, "a")], index[("ngram", 1, "a")]
    assert none_a["tok_per_s"] == pytest.approx(10.0)
    assert ngram_a["tok_per_s"] == pytest.approx(20.0)
    assert ngram_a["ratio"] == pytest.approx(2.0)
    assert (ngram_a["text_identical"], ngram_a["text_compared"]) == (1, 2)
    assert ngram_a["text_match"] == pytest.approx(0.5)
    assert none_a["ratio"] is None and none_a["text_match"] is None

    ngram_b = index[("ngram", 1, "b")]
    assert ngram_b["ratio"] == pytest.approx(0.5)
    assert ngram_b["mean_acceptance_length"] == pytest.approx(1.0)
    assert ngram_b["acceptance_rate"] == pytest.approx(0.0)
    assert ngram_b["text_match"] == pytest.approx(1.0)

    # "all": tokens and wall times and counters pooled over the blocks.
    none_all, ngram_all = index[("none", 1, "all")], index[("ngram", 1, "all")]
    assert none_all["tok_per_s"] == pytest.approx(200 / 20)
    assert ngram_all["tok_per_s"] == pytest.approx(200 / 25)
    assert ngram_all["ratio"] == pytest.approx(0.8)
    assert ngram_all["mean_acceptance_length"] == pytest.approx(1 + 20 / 40)
    assert ngram_all["acceptance_rate"] == pytest.approx(20 / 320)
    assert ngram_all["tokens_per_forward"] == pytest.approx(200 / 180)
    assert (ngram_all["text_identical"], ngram_all["text_compared"]) == (2, 3)


def test_aggregate_compares_text_at_the_same_concurrency_only():
    requests = [
        req("none", 1, "a", 1, "x", 10), req("none", 2, "a", 1, "y", 10), req("ngram", 2, "a", 1, "y", 10),
    ]
    blocks = [{"config": c, "concurrency": n, "category": "a", "wall_s": 1.0, "spec": None}
              for c, n in (("none", 1), ("none", 2), ("ngram", 2))]
    rows = {(r["config"], r["concurrency"], r["category"]): r for r in stats.aggregate(requests, blocks)}
    assert rows[("ngram", 2, "a")]["text_match"] == 1.0


def test_text_match_skips_failed_requests():
    base = [req("none", 1, "a", 1, "x", 5), req("none", 1, "a", 2, None, 0, error="boom")]
    other = [
        req("ngram", 1, "a", 1, "x", 5), req("ngram", 1, "a", 2, "z", 5), req("ngram", 1, "a", 3, "q", 5),
    ]
    assert stats.text_match(other, base) == (1, 1)


def test_one_measurement_keeps_the_rows_of_a_single_run():
    requests, blocks = synthetic_run()
    rows = {(r["config"], r["concurrency"], r["category"]): r for r in stats.aggregate(requests, blocks)}
    # Explicit round/repeat 0 is the same measurement as records without them.
    tagged = stats.aggregate([dict(r, round=0, repeat=0) for r in requests],
                             [dict(b, round=0, repeat=0) for b in blocks])
    assert tagged == list(rows.values())
    ngram_a = rows[("ngram", 1, "a")]
    assert ngram_a["samples"] == 1 and ngram_a["tok_per_s_min"] == ngram_a["tok_per_s_max"] == 20.0
    assert ngram_a["ratio_low"] is None and ngram_a["ratio_high"] is None  # one sample: no interval
    assert rows[("none", 1, "all")]["text_compared"] is None  # the baseline has nothing to compare with
    assert [s["ratio"] for s in rows[("ngram", 1, "all")]["per_sample"]] == [pytest.approx(0.8)]


def test_aggregate_with_repeats_means_spread_and_interval():
    requests, blocks = repeated_run()
    rows = {(r["config"], r["concurrency"], r["category"]): r for r in stats.aggregate(requests, blocks)}
    none_a, ngram_a = rows[("none", 1, "a")], rows[("ngram", 1, "a")]
    # 100 tokens per repeat in category a: none 10 and 12.5 tok/s, ngram 20 and 25.
    assert none_a["samples"] == 2 and none_a["tok_per_s"] == pytest.approx(11.25)
    assert (none_a["tok_per_s_min"], none_a["tok_per_s_max"]) == (pytest.approx(10.0), pytest.approx(12.5))
    assert ngram_a["tok_per_s"] == pytest.approx(22.5)
    assert ngram_a["ratio"] == pytest.approx(22.5 / 11.25)
    assert ngram_a["ratio_low"] == pytest.approx(20.0 / 12.5)
    assert ngram_a["ratio_high"] == pytest.approx(25.0 / 10.0)
    assert [s["ratio"] for s in ngram_a["per_sample"]] == [pytest.approx(2.0), pytest.approx(2.0)]
    assert [s["repeat"] for s in ngram_a["per_sample"]] == [0, 1]
    # Counters: per repeat, and summed for the row (ratios of totals).
    acceptance = [s["mean_acceptance_length"] for s in ngram_a["per_sample"]]
    assert acceptance == [pytest.approx(1.0), pytest.approx(2.0)]
    assert ngram_a["num_drafts"] == 30.0 and ngram_a["num_accepted_tokens"] == 20.0
    assert ngram_a["mean_acceptance_length"] == pytest.approx(1 + 20 / 30)
    assert ngram_a["tokens_per_forward"] == pytest.approx(200 / 180)
    assert ngram_a["completion_tokens"] == 200 and ngram_a["wall_s"] == pytest.approx(9.0)
    # Every repeat is compared with none's first: q2 differs in ngram's second repeat only.
    assert (ngram_a["text_identical"], ngram_a["text_compared"]) == (3, 4)
    # none's second repeat is checked against its first.
    assert (none_a["text_identical"], none_a["text_compared"]) == (2, 2)
    # "all": each repeat pools its own categories (none 200/20 and 200/20.5), then the mean.
    none_all, ngram_all = rows[("none", 1, "all")], rows[("ngram", 1, "all")]
    assert none_all["tok_per_s"] == pytest.approx((200 / 20 + 200 / 20.5) / 2)
    assert ngram_all["tok_per_s"] == pytest.approx((200 / 25 + 200 / 14) / 2)
    assert ngram_all["ratio_low"] == pytest.approx((200 / 25) / (200 / 20))
    assert ngram_all["ratio_high"] == pytest.approx((200 / 14) / (200 / 20.5))
    assert ngram_all["ratio_low"] < ngram_all["ratio"] < ngram_all["ratio_high"]
    assert (ngram_all["text_identical"], ngram_all["text_compared"]) == (5, 6)


def test_text_match_reference_is_the_baselines_first_successful_sample():
    base = [dict(req("none", 1, "a", 1, None, 0, error="boom"), repeat=0),
            dict(req("none", 1, "a", 1, "late", 5), repeat=1),
            dict(req("none", 1, "a", 2, "x", 5), round=1, repeat=0),
            dict(req("none", 1, "a", 2, "y", 5), round=0, repeat=1)]
    other = [dict(req("ngram", 1, "a", 1, "late", 5), repeat=0),
             dict(req("ngram", 1, "a", 2, "y", 5), repeat=0)]
    assert stats.text_match(other, base) == (2, 2)  # q1 from repeat 1 (repeat 0 failed), q2 from round 0
    assert stats.text_match(base, base) == (0, 1)  # q2 of round 1 ("x") against round 0's "y"


def test_missing_samples_do_not_make_up_an_interval():
    requests, blocks = repeated_run()
    # ngram's second repeat was never measured (its server died): one sample, no interval.
    requests = [r for r in requests if not (r["config"] == "ngram" and r["repeat"] == 1)]
    blocks = [b for b in blocks if not (b["config"] == "ngram" and b["repeat"] == 1)]
    rows = {(r["config"], r["concurrency"], r["category"]): r for r in stats.aggregate(requests, blocks)}
    ngram_a = rows[("ngram", 1, "a")]
    assert ngram_a["samples"] == 1 and ngram_a["ratio"] == pytest.approx(20.0 / 11.25)
    assert ngram_a["ratio_low"] is None and ngram_a["ratio_high"] is None


def test_latency_percentiles():
    assert stats.percentile([], 50) is None
    assert stats.percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.5
    assert stats.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 90) == 4.6


def test_latency_figures_follow_vllm_bench_serve():
    # Two streamed requests: TTFT 0.1 and 0.3 s; TPOT per request; ITL pools every gap of both.
    reqs = [dict(req("c", 1, "a", 1, "x", 5), ttft_s=0.1, tpot_s=0.02, itl_s=[0.01, 0.03]),
            dict(req("c", 1, "a", 2, "y", 5), ttft_s=0.3, tpot_s=0.04, itl_s=[0.02]),
            dict(req("c", 1, "a", 3, None, 0, error="boom"), ttft_s=None, tpot_s=None, itl_s=[])]
    m = stats.block_metrics(reqs, 1.0, None)
    assert m["mean_ttft_ms"] == pytest.approx(200.0) and m["p50_ttft_ms"] == pytest.approx(200.0)
    assert m["p90_ttft_ms"] == pytest.approx(280.0) and m["p99_ttft_ms"] == pytest.approx(298.0)
    assert m["mean_tpot_ms"] == pytest.approx(30.0)
    assert m["mean_itl_ms"] == pytest.approx(20.0) and m["p50_itl_ms"] == pytest.approx(20.0)
    # Requests without streamed timings (results.json written before latency figures) give none.
    assert stats.block_metrics([req("c", 1, "a", 1, "x", 5)], 1.0, None)["mean_ttft_ms"] is None


def test_latency_figures_of_a_row_pool_every_sample():
    requests, blocks = repeated_run()
    for i, r in enumerate(requests):
        r.update(ttft_s=0.1 * (i + 1), tpot_s=0.01, itl_s=[0.01])
    rows = {(r["config"], r["category"]): r for r in stats.aggregate(requests, blocks)}
    none_a = rows[("none", "a")]  # q1 and q2 of both repeats: requests 0, 1, 3, 4
    assert none_a["mean_ttft_ms"] == pytest.approx(1000 * (0.1 + 0.2 + 0.4 + 0.5) / 4)
    assert rows[("ngram", "all")]["mean_tpot_ms"] == pytest.approx(10.0)


def test_rows_sum_freespecs_per_source_counters_of_their_blocks():
    requests, blocks = synthetic_run()
    blocks[2]["sources"] = {"copy": {"draft_tokens": 60.0, "accepted_tokens": 15.0, "seconds": 0.5},
                            "recycle": {"draft_tokens": 20.0, "accepted_tokens": 5.0, "seconds": 0.25}}
    blocks[3]["sources"] = {"copy": {"draft_tokens": 40.0, "accepted_tokens": 0.0, "seconds": 0.5}}
    wall_a, wall_b = blocks[2]["wall_s"], blocks[3]["wall_s"]
    rows = {(r["config"], r["category"]): r for r in stats.aggregate(requests, blocks)}
    assert rows[("ngram", "a")]["sources"]["recycle"] == {
        "draft_tokens": 20.0, "accepted_tokens": 5.0, "seconds": 0.25, "acceptance_rate": 0.25,
        "time_share": pytest.approx(0.25 / wall_a)}
    assert rows[("ngram", "all")]["sources"]["copy"] == {
        "draft_tokens": 100.0, "accepted_tokens": 15.0, "seconds": 1.0, "acceptance_rate": 0.15,
        "time_share": pytest.approx(1.0 / (wall_a + wall_b))}
    assert rows[("none", "all")]["sources"] is None  # no freespec plugin, no per-source figures
