"""Unit tests of ``freespec bench``'s pure parts: no server, no model."""
from __future__ import annotations

import argparse
import json
import math
import os

import pytest

from freespec.cli import bench
from freespec.questions import read_questions

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
    samples = bench.parse_prometheus_text(text)
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
    with pytest.raises(ValueError, match="line 2"):
        bench.parse_prometheus_text("ok 1\nthis is not a sample line at all\n")


def test_sum_metric_sums_label_sets_and_reports_absence():
    samples = bench.parse_prometheus_text(METRICS_SPEC)
    assert bench.sum_metric(samples, "vllm:spec_decode_num_drafts_total") == 15.0
    assert bench.sum_metric(samples, "vllm:nope") is None


def test_spec_counters_from_metrics_text():
    assert bench.spec_counters(METRICS_SPEC) == {
        "num_drafts": 15.0,
        "num_draft_tokens": 120.0,
        "num_accepted_tokens": 30.0,
    }
    # A server without speculation exposes none of the counters.
    assert bench.spec_counters(METRICS_NONE) is None


def test_counter_delta():
    before = {"num_drafts": 10.0, "num_draft_tokens": 80.0, "num_accepted_tokens": 20.0}
    after = {"num_drafts": 14.0, "num_draft_tokens": 112.0, "num_accepted_tokens": 29.0}
    assert bench.counter_delta(before, after) == {
        "num_drafts": 4.0, "num_draft_tokens": 32.0, "num_accepted_tokens": 9.0,
    }
    assert bench.counter_delta(None, after) == after
    assert bench.counter_delta(None, None) is None


# ---------------------------------------------------------------- config specs


def test_parse_config_spec_builtin_methods():
    none = bench.parse_config_spec("none", 8)
    assert none.is_baseline and none.speculative_config is None and none.label == "none"
    ngram = bench.parse_config_spec("ngram", 8)
    assert ngram.speculative_config == {
        "method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 5, "prompt_lookup_min": 5,
    }
    suffix = bench.parse_config_spec("suffix", 6)
    assert suffix.speculative_config == {"method": "suffix", "num_speculative_tokens": 6}


def test_parse_config_spec_vllm_draft_model_needs_its_model():
    sc = bench.parse_config_spec('draft_model:{"model": "/m/draft"}', 4).speculative_config
    assert sc == {"method": "draft_model", "num_speculative_tokens": 4, "model": "/m/draft"}
    with pytest.raises(bench.ConfigSpecError, match=r"draft_model needs option 'model'"):
        bench.parse_config_spec("draft_model", 4)


def test_parse_config_spec_ngram_options_replace_lookup_defaults():
    sc = bench.parse_config_spec('ngram:{"prompt_lookup_min": 2}', 8).speculative_config
    assert sc == {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2}


def test_parse_config_spec_plugin_with_options():
    config = bench.parse_config_spec('copy:{"min_match": 3, "num_speculative_tokens": 4}', 8)
    assert config.name == "copy"
    assert config.label == 'copy:{"min_match": 3, "num_speculative_tokens": 4}'
    assert config.speculative_config == {"plugin": "copy", "num_speculative_tokens": 4, "min_match": 3}
    plain = bench.parse_config_spec("copy", 8)
    assert plain.speculative_config == {"plugin": "copy", "num_speculative_tokens": 8}


@pytest.mark.parametrize(
    "spec, message",
    [
        ('copy:{"min_match": 3', r"config 'copy'.*not valid JSON"),
        ("copy:[1, 2]", r"config 'copy'.*JSON object"),
        ("copy:", r"nothing after ':'"),
        ('none:{"x": 1}', r"takes no options"),
        ('copy:{"plugin": "other"}', r"option 'plugin'"),
        ('ngram:{"method": "suffix"}', r"option 'method'"),
        ("bad name", r"not a config name"),
    ],
)
def test_parse_config_spec_errors_name_the_config(spec, message):
    with pytest.raises(bench.ConfigSpecError, match=message):
        bench.parse_config_spec(spec, 8)


def test_split_config_list_keeps_json_together():
    assert bench.split_config_list('none, ngram,copy:{"a": 1, "b": [1, 2], "c": "x,}"},suffix') == [
        "none", "ngram", 'copy:{"a": 1, "b": [1, 2], "c": "x,}"}', "suffix",
    ]


def test_parse_config_list_puts_baseline_first_and_adds_it():
    configs = bench.parse_config_list(["ngram,none", "copy"], 8)
    assert [c.label for c in configs] == ["none", "ngram", "copy"]
    configs = bench.parse_config_list(["ngram"], 8)
    assert [c.label for c in configs] == ["none", "ngram"]
    with pytest.raises(bench.ConfigSpecError, match="twice"):
        bench.parse_config_list(["ngram", "ngram"], 8)


# ---------------------------------------------------------------- questions


def _write_questions(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture()
def questions_file(tmp_path):
    rows = []
    qid = 0
    for category in ("writing", "math", "rag"):
        for i in range(3):
            qid += 1
            turns = [f"{category} q{i}", "second turn"]
            rows.append({"question_id": qid, "category": category, "turns": turns})
    path = tmp_path / "question.jsonl"
    _write_questions(path, rows)
    return path


def test_select_questions_filters_and_limits_in_file_order(questions_file):
    questions = read_questions(questions_file)
    selected = bench.select_questions(questions, ["rag", "writing"], 2)
    assert list(selected) == ["rag", "writing"]
    assert [q.prompt for q in selected["rag"]] == ["rag q0", "rag q1"]
    assert [q.question_id for q in selected["writing"]] == [1, 2]
    everything = bench.select_questions(questions, None, None)
    assert list(everything) == ["writing", "math", "rag"] and sum(map(len, everything.values())) == 9
    with pytest.raises(bench.BenchError, match="unknown category nope.*writing, math, rag"):
        bench.select_questions(questions, ["nope"], 1)


def test_new_questions_per_level_gives_each_level_the_next_ones(questions_file):
    questions = read_questions(questions_file)
    levels = bench.select_questions_per_level(questions, ["writing", "rag"], [1], [1, 4, 16], True)
    assert {c: [q.prompt for qs in sel.values() for q in qs] for c, sel in levels.items()} == {
        1: ["writing q0", "rag q0"], 4: ["writing q1", "rag q1"], 16: ["writing q2", "rag q2"]}
    same = bench.select_questions_per_level(questions, ["writing"], [2], [1, 8], False)
    assert same[1] == same[8] and [q.prompt for q in same[8]["writing"]] == ["writing q0", "writing q1"]
    # Past the end of a category: fewer (or no) questions, not an error.
    beyond = bench.select_questions_per_level(questions, ["math"], [2], [1, 2], True)
    assert [q.prompt for q in beyond[2]["math"]] == ["math q2"]
    # One count per level: the levels take 1, then 2 questions of each category.
    sweep = bench.select_questions_per_level(questions, ["rag"], [1, 2], [1, 39], True)
    assert [q.prompt for q in sweep[1]["rag"]] == ["rag q0"]
    assert [q.prompt for q in sweep[39]["rag"]] == ["rag q1", "rag q2"]
    with pytest.raises(bench.BenchError, match="2 values for 3 concurrency levels"):
        bench.select_questions_per_level(questions, None, [1, 2], [1, 4, 16], True)
    with pytest.raises(bench.BenchError, match="needs --per-category"):
        bench.select_questions_per_level(questions, None, None, [1, 4], True)


def test_warmup_prompts_avoid_measured_questions(questions_file):
    questions = read_questions(questions_file)
    selected = bench.select_questions(questions, ["writing", "math"], 2)
    measured = [q for qs in selected.values() for q in qs]
    warm = bench.select_warmup_prompts(questions, measured, 4)
    assert warm == ["writing q2", "math q2", "rag q0", "rag q1"]  # round-robin over unmeasured ones
    assert not set(warm) & {q.prompt for q in measured}
    # Everything measured: built-in prompts fill in.
    all_warm = bench.select_warmup_prompts(questions, questions, 2)
    assert len(all_warm) == 2 and not set(all_warm) & {q.prompt for q in questions}
    assert bench.select_warmup_prompts(questions, measured, 0) == []


# ---------------------------------------------------------------- aggregation


def _req(config, concurrency, category, qid, output, tokens, error=None):
    return {"config": config, "concurrency": concurrency, "category": category, "question_id": qid,
            "output": output, "completion_tokens": tokens, "latency_s": 1.0, "error": error}


def test_block_metrics_math():
    reqs = [_req("ngram", 1, "a", 1, "x", 60), _req("ngram", 1, "a", 2, "y", 40)]
    spec = {"num_drafts": 20.0, "num_draft_tokens": 160.0, "num_accepted_tokens": 40.0}
    m = bench.block_metrics(reqs, 4.0, spec)
    assert m["completion_tokens"] == 100
    assert m["tok_per_s"] == pytest.approx(25.0)
    assert m["mean_acceptance_length"] == pytest.approx(1 + 40 / 20)
    assert m["acceptance_rate"] == pytest.approx(40 / 160)
    assert m["tokens_per_forward"] == pytest.approx(100 / 60)


def test_block_metrics_without_speculation_and_with_errors():
    reqs = [_req("none", 1, "a", 1, "x", 50), _req("none", 1, "a", 2, None, 0, error="HTTP 400: too long")]
    m = bench.block_metrics(reqs, 2.0, None)
    assert m["num_errors"] == 1 and m["num_requests"] == 2
    assert m["tok_per_s"] == pytest.approx(25.0)
    assert m["mean_acceptance_length"] is None and m["acceptance_rate"] is None
    assert m["tokens_per_forward"] == pytest.approx(1.0)
    # Speculation configured but nothing ever drafted: no acceptance figures, 1 token per forward.
    zero = {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0}
    m = bench.block_metrics(reqs, 2.0, zero)
    assert m["mean_acceptance_length"] is None and m["acceptance_rate"] is None
    assert m["tokens_per_forward"] == pytest.approx(1.0)


def _synthetic_run():
    requests = [
        _req("none", 1, "a", 1, "alpha", 40), _req("none", 1, "a", 2, "beta", 60),
        _req("none", 1, "b", 3, "gamma", 100),
        _req("ngram", 1, "a", 1, "alpha", 40), _req("ngram", 1, "a", 2, "BETA", 60),
        _req("ngram", 1, "b", 3, "gamma", 100),
    ]
    blocks = [
        {"config": "none", "concurrency": 1, "category": "a", "wall_s": 10.0, "spec": None},
        {"config": "none", "concurrency": 1, "category": "b", "wall_s": 10.0, "spec": None},
        {"config": "ngram", "concurrency": 1, "category": "a", "wall_s": 5.0,
         "spec": {"num_drafts": 10.0, "num_draft_tokens": 80.0, "num_accepted_tokens": 20.0}},
        {"config": "ngram", "concurrency": 1, "category": "b", "wall_s": 20.0,
         "spec": {"num_drafts": 30.0, "num_draft_tokens": 240.0, "num_accepted_tokens": 0.0}},
    ]
    return requests, blocks


def test_aggregate_ratios_text_match_and_all_rows():
    requests, blocks = _synthetic_run()
    rows = bench.aggregate(requests, blocks)
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
        _req("none", 1, "a", 1, "x", 10), _req("none", 2, "a", 1, "y", 10), _req("ngram", 2, "a", 1, "y", 10),
    ]
    blocks = [{"config": c, "concurrency": n, "category": "a", "wall_s": 1.0, "spec": None}
              for c, n in (("none", 1), ("none", 2), ("ngram", 2))]
    rows = {(r["config"], r["concurrency"], r["category"]): r for r in bench.aggregate(requests, blocks)}
    assert rows[("ngram", 2, "a")]["text_match"] == 1.0


def test_text_match_skips_failed_requests():
    base = [_req("none", 1, "a", 1, "x", 5), _req("none", 1, "a", 2, None, 0, error="boom")]
    other = [
        _req("ngram", 1, "a", 1, "x", 5), _req("ngram", 1, "a", 2, "z", 5), _req("ngram", 1, "a", 3, "q", 5),
    ]
    assert bench.text_match(other, base) == (1, 1)


def test_one_measurement_keeps_the_rows_of_a_single_run():
    requests, blocks = _synthetic_run()
    rows = {(r["config"], r["concurrency"], r["category"]): r for r in bench.aggregate(requests, blocks)}
    # Explicit round/repeat 0 is the same measurement as records without them.
    tagged = bench.aggregate([dict(r, round=0, repeat=0) for r in requests],
                             [dict(b, round=0, repeat=0) for b in blocks])
    assert tagged == list(rows.values())
    ngram_a = rows[("ngram", 1, "a")]
    assert ngram_a["samples"] == 1 and ngram_a["tok_per_s_min"] == ngram_a["tok_per_s_max"] == 20.0
    assert ngram_a["ratio_low"] is None and ngram_a["ratio_high"] is None  # one sample: no interval
    assert rows[("none", 1, "all")]["text_compared"] is None  # the baseline has nothing to compare with
    assert [s["ratio"] for s in rows[("ngram", 1, "all")]["per_sample"]] == [pytest.approx(0.8)]


def _repeated_run():
    """none and ngram at concurrency 1, categories a and b, two repeats; ngram's 2nd repeat changes q2."""
    requests, blocks = [], []
    walls = {("none", 0): (10.0, 10.0), ("none", 1): (8.0, 12.5),
             ("ngram", 0): (5.0, 20.0), ("ngram", 1): (4.0, 10.0)}
    for (config, repeat), (wall_a, wall_b) in walls.items():
        beta = "BETA" if (config, repeat) == ("ngram", 1) else "beta"
        requests += [dict(_req(config, 1, "a", 1, "alpha", 40), repeat=repeat),
                     dict(_req(config, 1, "a", 2, beta, 60), repeat=repeat),
                     dict(_req(config, 1, "b", 3, "gamma", 100), repeat=repeat)]
        spec = {"num_drafts": 10.0 * (repeat + 1), "num_draft_tokens": 80.0,
                "num_accepted_tokens": 20.0 * repeat}
        for category, wall in (("a", wall_a), ("b", wall_b)):
            blocks.append({"config": config, "concurrency": 1, "category": category, "round": 0,
                           "repeat": repeat, "wall_s": wall, "spec": None if config == "none" else spec})
    return requests, blocks


def test_aggregate_with_repeats_means_spread_and_interval():
    requests, blocks = _repeated_run()
    rows = {(r["config"], r["concurrency"], r["category"]): r for r in bench.aggregate(requests, blocks)}
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
    base = [dict(_req("none", 1, "a", 1, None, 0, error="boom"), repeat=0),
            dict(_req("none", 1, "a", 1, "late", 5), repeat=1),
            dict(_req("none", 1, "a", 2, "x", 5), round=1, repeat=0),
            dict(_req("none", 1, "a", 2, "y", 5), round=0, repeat=1)]
    other = [dict(_req("ngram", 1, "a", 1, "late", 5), repeat=0),
             dict(_req("ngram", 1, "a", 2, "y", 5), repeat=0)]
    assert bench.text_match(other, base) == (2, 2)  # q1 from repeat 1 (repeat 0 failed), q2 from round 0
    assert bench.text_match(base, base) == (0, 1)  # q2 of round 1 ("x") against round 0's "y"


def test_missing_samples_do_not_make_up_an_interval():
    requests, blocks = _repeated_run()
    # ngram's second repeat was never measured (its server died): one sample, no interval.
    requests = [r for r in requests if not (r["config"] == "ngram" and r["repeat"] == 1)]
    blocks = [b for b in blocks if not (b["config"] == "ngram" and b["repeat"] == 1)]
    rows = {(r["config"], r["concurrency"], r["category"]): r for r in bench.aggregate(requests, blocks)}
    ngram_a = rows[("ngram", 1, "a")]
    assert ngram_a["samples"] == 1 and ngram_a["ratio"] == pytest.approx(20.0 / 11.25)
    assert ngram_a["ratio_low"] is None and ngram_a["ratio_high"] is None


# ---------------------------------------------------------------- rendering and CLI


def test_latency_percentiles():
    assert bench._percentile([], 50) is None
    assert bench._percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.5
    assert bench._percentile([1.0, 2.0, 3.0, 4.0, 5.0], 90) == 4.6


def test_render_markdown_table():
    requests, blocks = _synthetic_run()
    blocks_c2 = [dict(b, concurrency=2) for b in blocks]
    requests_c2 = [dict(r, concurrency=2) for r in requests]
    table = bench.render_markdown(bench.aggregate(requests + requests_c2, blocks + blocks_c2))
    lines = table.strip().splitlines()
    assert lines[0].startswith("| config | category | c=1 tok/s | c=1 ×none | c=1 acc len |")
    assert "c=2 match" in lines[0]
    assert len(lines) == 2 + 6  # header, rule, 2 configs x (a, b, all)
    ngram_a = next(line for line in lines if line.startswith("| ngram | a |"))
    cells = [c.strip() for c in ngram_a.strip("|").split("|")]
    # tok/s, ratio, acc len, acc rate, tok/fwd, match, latency p50/p90 for c=1, then the same for c=2
    assert cells[2:8] == ["20.0", "2.00", "3.00", "25.0%", "1.25", "1/2"]
    assert "/" in cells[8] and cells[9:16] == cells[2:9]
    none_all = next(line for line in lines if line.startswith("| none | all |"))
    assert [c.strip() for c in none_all.strip("|").split("|")][2:8] == ["10.0", "–", "–", "–", "1.00", "–"]
    assert lines.index(none_all) < lines.index(ngram_a)


def test_render_markdown_one_measurement_is_unchanged():
    # The table of a single measurement as freespec bench printed it before --repeats existed.
    requests, blocks = _synthetic_run()
    assert bench.render_markdown(bench.aggregate(requests, blocks)) == (
        "| config | category | c=1 tok/s | c=1 ×none | c=1 acc len | c=1 acc rate | c=1 tok/fwd | c=1 match "
        "| c=1 p50/p90 s |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|\n"
        "| none | a | 10.0 | – | – | – | 1.00 | – | 1.0/1.0 |\n"
        "| none | b | 10.0 | – | – | – | 1.00 | – | 1.0/1.0 |\n"
        "| none | all | 10.0 | – | – | – | 1.00 | – | 1.0/1.0 |\n"
        "| ngram | a | 20.0 | 2.00 | 3.00 | 25.0% | 1.25 | 1/2 | 1.0/1.0 |\n"
        "| ngram | b | 5.0 | 0.50 | 1.00 | 0.0% | 1.00 | 1/1 | 1.0/1.0 |\n"
        "| ngram | all | 8.0 | 0.80 | 1.50 | 6.2% | 1.11 | 2/3 | 1.0/1.0 |\n"
    )


def test_render_markdown_shows_the_spread_of_repeats():
    requests, blocks = _repeated_run()
    lines = bench.render_markdown(bench.aggregate(requests, blocks)).splitlines()
    split = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    cells = {(row[0], row[1]): row for row in split}
    assert cells[("none", "a")][2:4] == ["11.2 ±1.2", "–"]  # mean 11.25, half-range 1.25
    assert cells[("none", "a")][7] == "2/2"  # none's second repeat against its first
    assert cells[("ngram", "a")][2:4] == ["22.5 ±2.5", "2.00 (1.60–2.50)"]
    assert cells[("ngram", "a")][7] == "3/4"


def test_plot_ratios_writes_png(tmp_path):
    requests, blocks = _synthetic_run()
    rows = bench.aggregate(requests, blocks)
    path = tmp_path / "results.png"
    assert bench.plot_ratios(rows, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    only_baseline = [r for r in rows if r["config"] == "none"]
    assert not bench.plot_ratios(only_baseline, tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


def test_plot_ratios_with_repeats_writes_png_with_error_bars(tmp_path, monkeypatch):
    import matplotlib.axes

    bars = []
    original = matplotlib.axes.Axes.bar
    monkeypatch.setattr(matplotlib.axes.Axes, "bar",
                        lambda self, *a, **kw: bars.append(kw) or original(self, *a, **kw))
    requests, blocks = _repeated_run()
    rows = bench.aggregate(requests, blocks)
    assert bench.plot_ratios(rows, tmp_path / "results.png")
    assert (tmp_path / "results.png").read_bytes()[:4] == b"\x89PNG"
    (below, above), = [kw["yerr"] for kw in bars]  # one config besides none: one bar call
    ngram_a = next(r for r in rows if (r["config"], r["category"]) == ("ngram", "a"))
    assert below[0] == pytest.approx(ngram_a["ratio"] - ngram_a["ratio_low"])
    assert above[0] == pytest.approx(ngram_a["ratio_high"] - ngram_a["ratio"])
    bars.clear()
    assert bench.plot_ratios(bench.aggregate(*_synthetic_run()), tmp_path / "one.png")
    assert "yerr" not in bars[0]  # one measurement: no error bars


def test_add_parser_defaults_and_values():
    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench"])
    assert args.func is bench.run
    defaults = (args.max_tokens, args.temperature, args.dtype, args.num_speculative_tokens)
    assert defaults == (128, 0.0, None, 8)  # dtype: chosen for the machine at run time (freespec.machine)
    assert args.questions is None  # resolved at run time: see tests/test_questions.py
    copy = 'copy:{"a":1,"b":2}'
    args = parser.parse_args(["bench", "--concurrency", "1", "8", "--configs", "none,ngram", copy])
    assert args.concurrency == [1, 8]
    assert [c.label for c in bench.parse_config_list(args.configs, 8)] == ["none", "ngram", copy]
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--concurrency", "0"])
    assert (args.repeats, args.rounds) == (1, 1)
    args = parser.parse_args(["bench", "--repeats", "3", "--rounds", "2"])
    assert (args.repeats, args.rounds) == (3, 2)
    for option in ("--repeats", "--rounds"):
        with pytest.raises(SystemExit):
            parser.parse_args(["bench", option, "0"])


def test_server_command_uses_freespec_vllm_cli():
    args = argparse.Namespace(dtype="float32", max_model_len=2048, gpu_memory_utilization=0.3, seed=0,
                              server_args="--max-num-seqs 4")
    config = bench.parse_config_spec("ngram", 8)
    cmd = bench.server_command("/models/m", 8123, config, args)
    assert cmd[1:5] == ["-m", "freespec.vllm_plugins.vllm_cli", "serve", "/models/m"]
    assert cmd[cmd.index("--port") + 1] == "8123" and cmd[cmd.index("--dtype") + 1] == "float32"
    assert json.loads(cmd[cmd.index("--speculative-config") + 1]) == config.speculative_config
    assert cmd[-2:] == ["--max-num-seqs", "4"]
    baseline_cmd = bench.server_command("/m", 1, bench.parse_config_spec("none", 8), args)
    assert "--speculative-config" not in baseline_cmd


def test_run_reports_missing_questions(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--questions", str(tmp_path / "missing.jsonl"), "--model", "m",
                              "--out", str(tmp_path / "out")])
    assert bench.run(args) == 2
    err = capsys.readouterr().err
    assert "https://github.com/hemingkx/Spec-Bench" in err
    assert not (tmp_path / "out").exists()


def test_run_reports_bad_config_json(tmp_path, questions_file, capsys):
    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--questions", str(questions_file), "--model", "m",
                              "--configs", "copy:{oops}", "--out", str(tmp_path / "out")])
    assert bench.run(args) == 2
    assert "config 'copy'" in capsys.readouterr().err


# ---------------------------------------------------------------- end to end against a fake server

FAKE_SERVER = r'''
import json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, spec = int(sys.argv[1]), sys.argv[2] == "spec"
counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0}
lock = threading.Lock()

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, code, body, ctype="application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self._send(200, "")
        if self.path == "/metrics":
            text = "# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total 1.0\n"
            if spec:
                with lock:
                    text += (
                        f'vllm:spec_decode_num_drafts_total{{engine="0"}} {counters["drafts"]}\n'
                        f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {counters["draft_tokens"]}\n'
                        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {counters["accepted"]}\n'
                    )
            return self._send(200, text, "text/plain")
        self._send(404, "{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][0]["content"]
        if "FAIL" in prompt:
            return self._send(400, json.dumps({"error": "prompt too long"}))
        tokens = body["max_tokens"]
        if spec:
            with lock:
                counters["drafts"] += 2
                counters["draft_tokens"] += 8
                counters["accepted"] += 4
        out = prompt.upper() if not (spec and "q1" in prompt) else "different"
        self._send(200, json.dumps({
            "choices": [{"message": {"role": "assistant", "content": out}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": tokens + 5},
        }))

ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


def parse_bench_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


@pytest.fixture
def fake_server(tmp_path, monkeypatch):
    """The fake vLLM server's script, with bench's polling made fast (tests point server_command at it)."""
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    monkeypatch.setattr(bench, "HEALTH_POLL_S", 0.05)
    monkeypatch.setattr(bench, "METRICS_SETTLE_S", 0.01)
    return script

def test_run_end_to_end_with_a_fake_server(tmp_path, questions_file, monkeypatch, capsys, fake_server):
    started = []

    def fake_command(model, port, config, args):
        cmd = [bench.sys.executable, str(fake_server), str(port), "plain" if config.is_baseline else "spec"]
        started.append(cmd)
        return cmd

    monkeypatch.setattr(bench, "server_command", fake_command)
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name: None)  # no arctic_inference
    out = tmp_path / "out"
    args = parse_bench_args(
        "--questions", str(questions_file), "--model", "fake-model", "--categories", "writing,math",
        "--per-category", "2", "--max-tokens", "16", "--concurrency", "1", "2", "--configs", "none,ngram,suffix",
        "--warmup", "2", "--out", str(out), "--server-timeout", "60",
    )
    assert bench.run(args) == 0
    printed = capsys.readouterr().out
    assert "suffix" in printed and "arctic-inference" in printed
    assert len(started) == 4  # a fresh server per config x concurrency

    result = json.loads((out / "results.json").read_text())
    assert result["status"] == "complete"
    assert {c["label"]: c["status"] for c in result["configs"]} == {"suffix": "skipped", "none": "ok", "ngram": "ok"}
    assert len(result["requests"]) == 2 * 2 * 2 * 2  # configs x concurrency x categories x questions
    assert all(r["completion_tokens"] == 16 and r["error"] is None for r in result["requests"])
    rows = {(r["config"], r["concurrency"], r["category"]): r for r in result["aggregates"]}
    ngram = rows[("ngram", 1, "writing")]
    # 2 requests in the block, each adding 2 drafts / 8 draft tokens / 4 accepted in the fake server.
    assert (ngram["num_drafts"], ngram["num_draft_tokens"], ngram["num_accepted_tokens"]) == (4, 16, 8)
    assert ngram["mean_acceptance_length"] == pytest.approx(3.0)
    assert ngram["acceptance_rate"] == pytest.approx(0.5)
    assert ngram["tokens_per_forward"] == pytest.approx(32 / 24)
    assert (ngram["text_identical"], ngram["text_compared"]) == (1, 2)  # "writing q1" differs
    assert rows[("ngram", 1, "all")]["text_compared"] == 4
    # Above concurrency 1, all questions go in together as one "mixed" block.
    assert ("ngram", 2, "writing") not in rows and rows[("ngram", 2, "mixed")]["num_requests"] == 4
    assert rows[("none", 1, "writing")]["num_drafts"] is None
    assert (out / "results.png").read_bytes()[:4] == b"\x89PNG"
    md = (out / "results.md").read_text()
    assert "| ngram | writing |" in md and "suffix: skipped" in md
    assert "| ngram | writing |" in printed


def test_run_with_repeats_and_rounds_against_a_fake_server(tmp_path, questions_file, monkeypatch, capsys, fake_server):
    started = []

    def fake_command(model, port, config, args):
        started.append(config.label)
        return [bench.sys.executable, str(fake_server), str(port), "plain" if config.is_baseline else "spec"]

    monkeypatch.setattr(bench, "server_command", fake_command)
    out = tmp_path / "out"
    args = parse_bench_args(
        "--questions", str(questions_file), "--model", "fake-model", "--categories", "writing,math",
        "--per-category", "2", "--max-tokens", "16", "--configs", "none,ngram", "--warmup", "1",
        "--repeats", "2", "--rounds", "2", "--out", str(out), "--server-timeout", "60",
    )
    assert bench.run(args) == 0
    printed = capsys.readouterr().out
    assert started == ["none", "ngram", "none", "ngram"]  # the config list once per round, fresh servers
    assert "2 repeats per level on each server" in printed

    result = json.loads((out / "results.json").read_text())
    assert [(c["label"], c["round"]) for c in result["configs"]] == [("none", 0), ("ngram", 0), ("none", 1),
                                                                      ("ngram", 1)]
    assert len(result["requests"]) == 2 * 2 * 2 * 4  # configs x rounds x repeats x questions
    samples = [(r["round"], r["repeat"]) for r in result["requests"] if r["config"] == "ngram"]
    assert samples == [(0, 0)] * 4 + [(0, 1)] * 4 + [(1, 0)] * 4 + [(1, 1)] * 4
    rows = {(r["config"], r["concurrency"], r["category"]): r for r in result["aggregates"]}
    ngram = rows[("ngram", 1, "writing")]
    assert ngram["samples"] == 4
    assert [(s["round"], s["repeat"]) for s in ngram["per_sample"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # Each repeat's counter delta covers its own block only: 2 requests x 2 drafts.
    blocks = [b for b in result["blocks"] if (b["config"], b["category"]) == ("ngram", "writing")]
    assert [b["spec"]["num_drafts"] for b in blocks] == [4, 4, 4, 4]
    assert ngram["num_drafts"] == 16 and ngram["mean_acceptance_length"] == pytest.approx(3.0)
    assert ngram["tok_per_s_min"] <= ngram["tok_per_s"] <= ngram["tok_per_s_max"]
    assert ngram["ratio_low"] <= ngram["ratio"] <= ngram["ratio_high"]
    assert (ngram["text_identical"], ngram["text_compared"]) == (4, 8)  # "writing q1" differs in every repeat
    none = rows[("none", 1, "writing")]
    assert (none["text_identical"], none["text_compared"]) == (6, 6)  # none's later samples vs its first
    md = (out / "results.md").read_text()
    assert "Each block measured 4 times (2 rounds on fresh servers × 2 repeats per server)" in md
    ngram_line = next(line for line in md.splitlines() if line.startswith("| ngram | writing |"))
    assert " ±" in ngram_line and "4/8" in ngram_line
    assert (out / "results.png").read_bytes()[:4] == b"\x89PNG"


def test_run_reports_a_server_that_dies(tmp_path, questions_file, monkeypatch, capsys, fake_server):

    def fake_command(model, port, config, args):
        if config.is_baseline:
            return [bench.sys.executable, str(fake_server), str(port), "plain"]
        return [bench.sys.executable, "-c", "import sys; print('ValueError: no plugin named copy'); sys.exit(3)"]

    monkeypatch.setattr(bench, "server_command", fake_command)
    out = tmp_path / "out"
    args = parse_bench_args(
        "--questions", str(questions_file), "--model", "fake-model", "--per-category", "1",
        "--max-tokens", "4", "--configs", "none,copy", "--warmup", "0", "--out", str(out),
    )
    assert bench.run(args) == 1
    captured = capsys.readouterr()
    cause = "the vLLM server exited with code 3 before it was ready (ValueError: no plugin named copy)"
    assert cause in captured.err
    assert f"- copy: failed: {cause}; see " in captured.out  # the summary: one line per failed config
    result = json.loads((out / "results.json").read_text())
    assert result["status"] == "complete with failures"
    assert {c["label"]: c["status"] for c in result["configs"]} == {"none": "ok", "copy": "failed"}
    assert len(result["requests"]) == 3
    assert [r["config"] for r in result["aggregates"]] == ["none"] * 4


def test_log_failure_hint_finds_the_root_cause():
    log = "\n".join([
        "(APIServer pid=1) WARNING [system_utils.py:255] can cause `OSError: [Errno 24] Too many open files`.",
        "(VllmWorker-0 pid=2) ERROR [multiproc_executor.py:953] Traceback (most recent call last):",
        "(VllmWorker-0 pid=2) ERROR [multiproc_executor.py:953] ValueError: Available memory is too low.",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
        "RuntimeError: Engine core initialization failed. See root cause above.",
    ])
    assert bench.log_failure_hint(log) == "ValueError: Available memory is too low."
    assert bench.log_failure_hint(log.splitlines()[-1]) is None
    assert bench.log_failure_hint("all good\n") is None


def test_server_log_names_of_long_labels_do_not_collide():
    a = bench._slug('hybrid:{"sources":["copy","recycle","retrieval"],"datastore":"/data/ds","policy":"fixed"}')
    b = bench._slug('hybrid:{"sources":["copy","recycle","retrieval"],"datastore":"/data/ds","policy":"goodput"}')
    assert a != b and len(a) <= 60 and len(b) <= 60
    assert bench._slug("none") == "none" and bench._slug('copy:{"min_match":3}') == "copy_min_match_3"


def test_sigterm_stops_the_benchmarks_server(tmp_path):
    # A server runs in a session of its own; SIGTERM to the benchmark must still stop it (through the
    # same finally blocks as Ctrl-C), or `timeout freespec bench` leaves a vLLM server behind.
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "server.pid"
    script = f"""
import time
from pathlib import Path
from freespec.cli import bench
with bench.sigterm_as_interrupt():
    server = bench.Server(["sleep", "600"], 0, Path({str(tmp_path / 'log')!r}))
    server.start()
    Path({str(pid_file)!r}).write_text(str(server.proc.pid))
    try:
        time.sleep(600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop(grace=5)
"""
    proc = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    server_pid = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.kill(server_pid, 0)
            time.sleep(0.1)
