"""results.md: the table per config x category x load, the latency table, the header."""
from __future__ import annotations

from bench_helpers import repeated_run, synthetic_run

from freespec.bench import report
from freespec.bench.stats import aggregate


def test_render_markdown_table():
    requests, blocks = synthetic_run()
    blocks_c2 = [dict(b, concurrency=2) for b in blocks]
    requests_c2 = [dict(r, concurrency=2) for r in requests]
    table = report.render_markdown(aggregate(requests + requests_c2, blocks + blocks_c2))
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
    requests, blocks = synthetic_run()
    assert report.render_markdown(aggregate(requests, blocks)) == (
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
    requests, blocks = repeated_run()
    lines = report.render_markdown(aggregate(requests, blocks)).splitlines()
    split = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    cells = {(row[0], row[1]): row for row in split}
    assert cells[("none", "a")][2:4] == ["11.2 ±1.2", "–"]  # mean 11.25, half-range 1.25
    assert cells[("none", "a")][7] == "2/2"  # none's second repeat against its first
    assert cells[("ngram", "a")][2:4] == ["22.5 ±2.5", "2.00 (1.60–2.50)"]
    assert cells[("ngram", "a")][7] == "3/4"


def _with_latency(requests):
    for i, r in enumerate(requests):
        r.update(ttft_s=0.1, tpot_s=0.02 * (1 + i % 2), itl_s=[0.02, 0.04])
    return requests


def test_render_latency_markdown_one_row_per_config_and_load():
    requests, blocks = synthetic_run()
    rows = aggregate(_with_latency(requests), blocks)
    lines = report.render_latency_markdown(rows).strip().splitlines()
    assert lines[0] == ("| config | concurrency | tok/s | ×none | TTFT ms mean/p50/p90/p99 | TPOT ms mean/p50/p90/p99 "
                        "| ITL ms mean/p50/p90/p99 |")
    assert len(lines) == 2 + 2  # header, rule, none and ngram at concurrency 1 (the "all" rows)
    ngram = [c.strip() for c in lines[3].strip("|").split("|")]
    # ngram's three requests (the 4th to 6th): TPOT 40, 20, 40 ms; ITL gaps 20 and 40 ms in each.
    assert ngram == ["ngram", "1", "8.0", "0.80", "100.0/100.0/100.0/100.0", "33.3/40.0/40.0/40.0",
                     "30.0/30.0/40.0/40.0"]


def test_render_latency_markdown_shows_the_ratio_interval_of_repeats():
    requests, blocks = repeated_run()
    lines = report.render_latency_markdown(aggregate(_with_latency(requests), blocks)).splitlines()
    ngram = next(line for line in lines if line.startswith("| ngram |"))
    assert "(" in ngram.split("|")[4]  # ×none: ratio (low–high)


def test_results_header_names_the_server_of_a_run_it_did_not_start():
    started = report.results_header("m", "float32", 128, 0.0, 8, 26, "builtin", 1, 1)
    assert "dtype float32" in started and "num_speculative_tokens 8" in started
    attached = report.results_header("m", None, 128, 0.0, None, 26, "builtin", 1, 1, server="http://h:8000")
    assert "server http://h:8000" in attached and "dtype" not in attached and "num_speculative" not in attached
    assert "Each block measured 6 times" in report.results_header("m", "auto", 1, 0.0, 8, 1, "q", 3, 2)
    assert "Machine:" not in started
    assert "Machine: Zen, 2 cores. " in report.results_header("m", "auto", 1, 0.0, 8, 1, "q", 1, 1, machine="Zen, 2 cores")


def test_render_sources_markdown_lists_each_sources_accepted_and_drafted_tokens():
    requests, blocks = synthetic_run()
    assert report.render_sources_markdown(aggregate(requests, blocks)) == ""  # no freespec counters
    blocks[2]["sources"] = {"recycle": {"draft_tokens": 20.0, "accepted_tokens": 5.0, "seconds": 0.0},
                            "copy": {"draft_tokens": 60.0, "accepted_tokens": 15.0, "seconds": 0.0},
                            "hybrid": {"draft_tokens": 0.0, "accepted_tokens": 0.0, "seconds": 0.0}}
    blocks[2]["wall_s"] = 10.0
    blocks[2]["sources"]["copy"]["seconds"] = 0.2
    blocks[2]["sources"]["hybrid"]["seconds"] = 0.05
    lines = report.render_sources_markdown(aggregate(requests, blocks)).splitlines()
    # the plugin's own time (no tokens of its own) is listed under time only
    assert lines[2:] == ["| ngram | 1 | copy 15/60 (25%); recycle 5/20 (25%) "
                         "| 2.50% (copy 2.00%; hybrid 0.50%; recycle 0.00%) |"]
