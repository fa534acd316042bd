"""A whole run of ``freespec bench`` through its command line, against fake servers: no vLLM, no model."""
from __future__ import annotations

import argparse
import json
import sys

import pytest
from freespec.machine import machine_summary
from bench_helpers import fake_server_script, start_fake_server, write_questions
from freespec.cli import bench

from freespec.bench import run, server, serving
from freespec.bench.configs import parse_config_list


@pytest.fixture
def questions_file(tmp_path):
    return write_questions(tmp_path)


def parse_bench_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def test_add_parser_defaults_and_values():
    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench"])
    assert args.func is bench.run
    defaults = (args.max_tokens, args.temperature, args.dtype, args.num_speculative_tokens)
    assert defaults == (128, 0.0, None, 8)  # dtype: chosen for the machine at run time (freespec.machine)
    assert args.questions is None  # resolved at run time: see tests/test_questions.py
    copy = 'copy:{"min_match":3,"max_match":16}'
    args = parser.parse_args(["bench", "--concurrency", "1", "8", "--configs", "none,ngram", copy])
    assert args.concurrency == [1, 8]
    assert [c.label for c in parse_config_list(args.configs, 8)] == ["none", "ngram", copy]
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--concurrency", "0"])
    assert (args.repeats, args.rounds) == (1, 1)
    args = parser.parse_args(["bench", "--repeats", "3", "--rounds", "2"])
    assert (args.repeats, args.rounds) == (3, 2)
    for option in ("--repeats", "--rounds"):
        with pytest.raises(SystemExit):
            parser.parse_args(["bench", option, "0"])


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


@pytest.fixture
def fake_server(tmp_path, monkeypatch):
    """The fake vLLM server's script, with bench's polling made fast (tests point server_command at it)."""
    return fake_server_script(tmp_path, monkeypatch)


def test_run_end_to_end_with_a_fake_server(tmp_path, questions_file, monkeypatch, capsys, fake_server):
    started = []

    def fake_command(model, port, config, options, cpu):
        cmd = [sys.executable, str(fake_server), str(port), "plain" if config.is_baseline else "spec"]
        started.append(cmd)
        return cmd

    monkeypatch.setattr(serving, "server_command", fake_command)
    monkeypatch.setattr(serving, "suffix_available", lambda: False)
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
    assert result["machine"]["cores"] >= 1 and "binding_env" in result["machine"]  # the CPU the servers ran on
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
    # Streamed requests: each has its first-token time and chunk gaps; each row the latency figures.
    assert all(0 < r["ttft_s"] <= r["latency_s"] and r["itl_s"] and r["tpot_s"] > 0 for r in result["requests"])
    for row in (rows[("ngram", 2, "all")], rows[("none", 1, "all")]):
        assert 0 < row["mean_ttft_ms"] and row["p50_tpot_ms"] <= row["p99_tpot_ms"] and row["p90_itl_ms"] >= 0
    assert (out / "results.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "results_tpot.png").read_bytes()[:4] == b"\x89PNG"
    md = (out / "results.md").read_text()
    assert "| ngram | writing |" in md and "suffix: skipped" in md
    assert f"Machine: {machine_summary(result['machine'])}." in md
    assert "## Latency" in md and "| ngram | 2 |" in md
    # freespec's per-source counters from /metrics: 2 requests x (copy 6/3 in 0.02 s, recycle 2/1) per block.
    copy, recycle = ngram["sources"]["copy"], ngram["sources"]["recycle"]
    assert {k: copy[k] for k in ("draft_tokens", "accepted_tokens", "acceptance_rate")} == {
        "draft_tokens": 12, "accepted_tokens": 6, "acceptance_rate": 0.5}
    assert {k: recycle[k] for k in ("draft_tokens", "accepted_tokens", "acceptance_rate", "seconds")} == {
        "draft_tokens": 4, "accepted_tokens": 2, "acceptance_rate": 0.5, "seconds": 0.0}
    assert copy["seconds"] == pytest.approx(0.04) and copy["time_share"] > 0  # of a fake, fast wall time
    assert "## Sources" in md and "| ngram | 1 | copy 12/24 (50%); recycle 4/8 (50%) | " in md
    assert "| ngram | writing |" in printed and "| ngram | 2 |" in printed


def test_run_with_repeats_and_rounds_against_a_fake_server(tmp_path, questions_file, monkeypatch, capsys, fake_server):
    started = []

    def fake_command(model, port, config, options, cpu):
        started.append(config.label)
        return [sys.executable, str(fake_server), str(port), "plain" if config.is_baseline else "spec"]

    monkeypatch.setattr(serving, "server_command", fake_command)
    out = tmp_path / "out"
    args = parse_bench_args(
        "--questions", str(questions_file), "--model", "fake-model", "--categories", "writing,math",
        "--per-category", "2", "--max-tokens", "16", "--configs", "none,ngram", "--warmup", "1",
        "--repeats", "2", "--rounds", "2", "--out", str(out), "--server-timeout", "60",
    )
    assert bench.run(args) == 0
    printed = capsys.readouterr().out
    assert started == ["none", "ngram", "ngram", "none"]  # the list once per round, fresh servers, backwards in odd rounds
    assert "2 repeats per level on each server" in printed

    result = json.loads((out / "results.json").read_text())
    assert [(c["label"], c["round"]) for c in result["configs"]] == [("none", 0), ("ngram", 0), ("ngram", 1),
                                                                      ("none", 1)]
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


def test_interleaved_run_measures_each_block_on_every_config_in_turn(tmp_path, questions_file, monkeypatch,
                                                                     capsys, fake_server):
    started = []

    def fake_command(model, port, config, options, cpu):
        started.append((config.label, options.gpu_memory_utilization))
        return [sys.executable, str(fake_server), str(port), "plain" if config.is_baseline else "spec"]

    monkeypatch.setattr(serving, "server_command", fake_command)
    monkeypatch.setattr(server, "available_ram_fraction", lambda: 0.9)
    out = tmp_path / "out"
    args = parse_bench_args(
        "--questions", str(questions_file), "--model", "fake-model", "--per-category", "1", "--max-tokens", "8",
        "--concurrency", "1", "2", "--configs", "none,ngram,copy", "--warmup", "1", "--interleave",
        "--out", str(out), "--server-timeout", "60",
    )
    assert bench.run(args) == 0
    # One server per config for both levels, all up at once, each with a third of one server's memory share.
    share = server.interleaved_options(run.BenchOptions(), 3, cpu=run.is_cpu_vllm())[0].gpu_memory_utilization
    assert started == [("none", share), ("ngram", share), ("copy", share)]
    result = json.loads((out / "results.json").read_text())
    assert result["status"] == "complete"
    assert [(c["label"], len(c["servers"]), c["servers"][0]["concurrency"]) for c in result["configs"]] == [
        ("none", 1, [1, 2]), ("ngram", 1, [1, 2]), ("copy", 1, [1, 2])]
    assert all(c["servers"][0]["status"] == "ok" and "warmup_s" in c["servers"][0] for c in result["configs"])
    # Each block runs on every config before the next block starts; the first config rotates block by block.
    order = [(b["concurrency"], b["category"], b["config"]) for b in result["blocks"]]
    assert order == [(1, "writing", "none"), (1, "writing", "ngram"), (1, "writing", "copy"),
                     (1, "math", "ngram"), (1, "math", "copy"), (1, "math", "none"),
                     (1, "rag", "copy"), (1, "rag", "none"), (1, "rag", "ngram"),
                     (2, "mixed", "none"), (2, "mixed", "ngram"), (2, "mixed", "copy")]
    rows = {(r["config"], r["concurrency"], r["category"]): r for r in result["aggregates"]}
    assert rows[("ngram", 1, "math")]["num_drafts"] == 2  # each block's counters are its own server's
    assert rows[("copy", 2, "mixed")]["ratio"] is not None


def test_interleaved_run_goes_on_without_a_server_that_fails(tmp_path, questions_file, monkeypatch, capsys,
                                                               fake_server):
    def fake_command(model, port, config, options, cpu):
        if config.label == "copy":
            return [sys.executable, "-c", "import sys; print('ValueError: no plugin named copy'); sys.exit(3)"]
        return [sys.executable, str(fake_server), str(port), "plain" if config.is_baseline else "spec"]

    monkeypatch.setattr(serving, "server_command", fake_command)
    out = tmp_path / "out"
    args = parse_bench_args(
        "--questions", str(questions_file), "--model", "fake-model", "--per-category", "1", "--max-tokens", "4",
        "--configs", "none,copy,ngram", "--warmup", "0", "--interleave", "--out", str(out),
    )
    assert bench.run(args) == 1
    assert "the vLLM server exited with code 3 before it was ready" in capsys.readouterr().err
    result = json.loads((out / "results.json").read_text())
    assert {c["label"]: c["status"] for c in result["configs"]} == {"none": "ok", "copy": "failed", "ngram": "ok"}
    assert [b["config"] for b in result["blocks"]] == ["none", "ngram", "ngram", "none", "none", "ngram"]


def test_interleaved_run_stops_every_server_it_started_when_interrupted(tmp_path, monkeypatch):
    stopped = []

    class FakeServer:
        def __init__(self, cmd, port, log_path, env=None):
            self.cmd, self.log_path, self.proc = cmd, log_path, None

        def stop(self):
            stopped.append(self.cmd[0])

    def start(server, target, session, options, server_info):
        if target.config.label == "ngram":
            raise KeyboardInterrupt  # Ctrl-C while the second server starts

    monkeypatch.setattr(run, "Server", FakeServer)
    monkeypatch.setattr(serving, "Server", FakeServer)
    monkeypatch.setattr(serving, "server_command", lambda model, port, config, options, cpu: [config.label])
    monkeypatch.setattr(run, "start_server", start)
    targets = [run.Target(config, "m") for config in parse_config_list(["none,ngram,copy"], 8)]
    state = run.RunState(started_at="", command="", argv=[], settings={}, versions={})
    with pytest.raises(KeyboardInterrupt):
        run.bench_interleaved(targets, {1: {}}, [], run.BenchOptions(), tmp_path, state)
    assert stopped == ["none", "ngram"]  # the one being started too; copy never started


def test_run_reports_a_server_that_dies(tmp_path, questions_file, monkeypatch, capsys, fake_server):

    def fake_command(model, port, config, options, cpu):
        if config.is_baseline:
            return [sys.executable, str(fake_server), str(port), "plain"]
        return [sys.executable, "-c", "import sys; print('ValueError: no plugin named copy'); sys.exit(3)"]

    monkeypatch.setattr(serving, "server_command", fake_command)
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


def test_run_measures_running_servers_with_base_url(tmp_path, questions_file, monkeypatch, capsys, fake_server):
    def no_server(*args):
        raise AssertionError("--base-url starts no server")

    monkeypatch.setattr(serving, "server_command", no_server)
    plain, none_url = start_fake_server(fake_server, "plain")
    spec, hybrid_url = start_fake_server(fake_server, "spec")
    out = tmp_path / "out"
    try:
        args = parse_bench_args(
            "--base-url", hybrid_url, none_url, "--label", "hybrid", "none", "--questions", str(questions_file),
            "--categories", "writing", "--per-category", "2", "--max-tokens", "8", "--concurrency", "1", "2",
            "--warmup", "1", "--out", str(out))
        assert bench.run(args) == 0
    finally:
        for proc in (plain, spec):
            proc.kill()
            proc.wait()
    result = json.loads((out / "results.json").read_text())
    assert [(c["label"], c["base_url"]) for c in result["configs"]] == [("none", none_url), ("hybrid", hybrid_url)]
    assert all("memory" not in s and "command" not in s for c in result["configs"] for s in c["servers"])
    assert result["settings"]["model"] == "fake-model"  # the first model the server lists
    rows = {(r["config"], r["concurrency"], r["category"]): r for r in result["aggregates"]}
    hybrid = rows[("hybrid", 1, "writing")]
    assert (hybrid["num_drafts"], hybrid["num_accepted_tokens"]) == (4, 8)  # from the server's /metrics
    assert hybrid["ratio"] is not None and (hybrid["text_identical"], hybrid["text_compared"]) == (1, 2)
    assert rows[("none", 1, "writing")]["num_drafts"] is None
    md = (out / "results.md").read_text()
    assert f"server {hybrid_url}, {none_url}" in md and "dtype" not in md.splitlines()[2]


def test_base_url_needs_one_label_per_server(tmp_path, questions_file, capsys):
    args = parse_bench_args("--base-url", "http://127.0.0.1:9", "--questions", str(questions_file),
                            "--out", str(tmp_path / "out"))
    assert bench.run(args) == 2
    assert "give one label per server" in capsys.readouterr().err
    args = parse_bench_args("--base-url", "http://127.0.0.1:9", "--label", "hybrid", "--questions",
                            str(questions_file), "--out", str(tmp_path / "out"))
    assert bench.run(args) == 2
    assert "cannot reach the server at http://127.0.0.1:9" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_defaults_fit_the_machine(tmp_path, questions_file, monkeypatch, capsys, fake_server):
    seen = []

    def fake_command(model, port, config, options, cpu):
        seen.append((options.dtype, cpu, server.server_command(model, port, config, options, cpu)))
        return [sys.executable, str(fake_server), str(port), "plain"]

    monkeypatch.setattr(serving, "server_command", fake_command)
    monkeypatch.setattr(run, "is_cpu_vllm", lambda: True)
    monkeypatch.setattr(run, "default_dtype", lambda cpu: "float32" if cpu else "auto")
    monkeypatch.setattr(server, "available_ram_fraction", lambda: 0.9)  # a quiet machine
    monkeypatch.setattr(run, "describe_machine", lambda: {"vllm_cpu_build": True, "cores": 2, "binding_env": {}})
    args = parse_bench_args("--questions", str(questions_file), "--model", "m", "--configs", "none",
                            "--per-category", "1", "--max-tokens", "2", "--warmup", "0", "--out", str(tmp_path / "out"))
    assert bench.run(args) == 0
    (dtype, cpu, cmd), = seen
    assert (dtype, cpu) == ("float32", True)  # the dtype freespec.machine chooses for this CPU build
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == str(server.CPU_MEMORY_SHARE)
    assert "note: vLLM keeps 1 of these 2 cores" in capsys.readouterr().out  # how to give the model both cores


def test_the_bench_command_module_loads_no_numba():
    # `freespec serve` runs through the command line, which imports this module; vLLM forks its workers from
    # that process, and its Triton kernel dispatcher scans every loaded module and fails on numba's objects.
    import subprocess

    code = "import sys, freespec.cli.bench; print(sorted(m for m in ('numba', 'llvmlite') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"


@pytest.mark.parametrize("configs", [3, 4, 5, 6])
@pytest.mark.parametrize("rounds", [4, 8, 12])
def test_round_order_balances_drift_without_back_to_back_samples(configs, rounds):
    targets = [f"c{i}" for i in range(configs)]
    orders = [run.round_order(targets, r, rounds) for r in range(rounds)]
    assert all(sorted(order) == targets for order in orders)  # every config once a round
    positions = {t: sum(order.index(t) for order in orders) for t in targets}
    assert len(set(positions.values())) == 1, positions  # the same mean position for every config
    assert all(a[-1] != b[0] for a, b in zip(orders, orders[1:]))  # no config ends one round and starts the next
    assert orders[0] == targets  # the baseline listed first runs first


def test_round_order_in_pairs_when_rounds_are_not_a_multiple_of_four():
    targets = ["none", "suffix", "hybrid"]
    assert [run.round_order(targets, r, 2) for r in range(2)] == [targets, targets[::-1]]
    six = [run.round_order(targets, r, 6) for r in range(6)]
    assert six[4:] == [["suffix", "hybrid", "none"], ["none", "hybrid", "suffix"]]  # the left-over pair, rotated
    assert six[3][-1] != six[4][0]
    assert [run.round_order(["none", "x"], r, 4) for r in range(4)] == [["none", "x"], ["x", "none"]] * 2
