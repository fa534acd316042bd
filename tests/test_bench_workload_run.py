"""Whole workload runs of ``freespec bench --workload`` against fake servers: no vLLM, no model."""
from __future__ import annotations

import json
import sys

import pytest
from bench_helpers import fake_server_script, start_fake_server

from freespec.bench import run, server, serving
from freespec.bench.errors import BenchError
from freespec.bench.options import BenchOptions
from freespec.bench.workloads import chat, runner
from freespec.cli import bench
from test_bench_run import parse_bench_args


@pytest.fixture
def fake_server(tmp_path, monkeypatch):
    monkeypatch.setattr(chat, "installed_data_files", lambda: [])  # the same on every machine
    return fake_server_script(tmp_path, monkeypatch)


def modes(script, started, mode_of, shares=None):
    def fake_command(model, port, config, options, cpu):
        started.append(config.label)
        if shares is not None:
            shares.append(options.gpu_memory_utilization)
        return [sys.executable, str(script), str(port), mode_of(config)]
    return fake_command


def test_agent_suite_with_repeated_traffic(tmp_path, monkeypatch, capsys, fake_server):
    started, shares = [], []
    monkeypatch.setattr(serving, "server_command", modes(fake_server, started,
                                                     lambda c: "plain" if c.is_baseline else "spec", shares))
    monkeypatch.setattr(server, "available_ram_fraction", lambda: 0.9)
    monkeypatch.setattr(runner, "server_command", serving.server_command)
    out = tmp_path / "out"
    args = parse_bench_args(
        "--workload", "agent-suite", "--model", "fake-model", "--configs", "none", "ngram-table",
        "--sessions", "2", "--turns", "3", "--max-tokens", "8", "--warmup", "1", "--dtype", "float32",
        "--repeat-traffic", "same", "restart", "replica", "--out", str(out), "--server-timeout", "60")
    assert bench.run(args) == 0
    printed = capsys.readouterr().out
    assert "workload chat skipped: no ShareGPT conversations" in printed
    # A server per config, started again for the restart pass, and a replica each.
    assert started == ["none", "none", "ngram-table", "ngram-table"]
    # With a replica two servers of a config are up at once: each has half the share, as --interleave gives.
    half = server.interleaved_options(run.BenchOptions(), 2, cpu=run.is_cpu_vllm())[0].gpu_memory_utilization
    assert shares == [half] * 4
    result = json.loads((out / "results.json").read_text())
    assert result["status"] == "complete"
    assert [w["name"] for w in result["settings"]["workloads"]] == ["code-edit", "tool-loop", "rag", "chat"]
    ngram = next(c for c in result["configs"] if c["label"] == "ngram-table")
    assert ngram["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 4, 8], [5, 12, 4],
                                                                                   [13, 512, 0]]
    assert [s.get("role") for s in ngram["servers"]] == [None, "replica"] and len(ngram["servers"][0]["restart_s"]) == 1
    turns = [r for r in result["requests"] if r["config"] == "none" and r["pass"] == "first"]
    assert len(turns) == 3 * 2 * 3  # workloads x sessions x turns
    assert {(r["workload"], r["turn"]) for r in turns} >= {("code-edit", 2), ("tool-loop", 2), ("rag", 2)}
    assert all(r["question_id"] == f"{r['session_id']}/t{r['turn']}" for r in turns)
    rows = {(r["config"], r["concurrency"], r["category"]): r for r in result["aggregates"]}
    for category in ("code-edit", "tool-loop · same", "rag · restart", "code-edit · replica"):
        row = rows[("ngram-table", 1, category)]
        assert row["text_compared"] == 6 and row["ratio"] is not None  # every turn of every session compared
    md = (out / "results.md").read_text()
    for section in ("## code-edit", "## tool-loop", "## rag", "## chat", "## All workloads", "## Latency"):
        assert section in md
    assert "skipped: no ShareGPT conversations" in md
    assert "| ngram-table | rag · restart |" in md and "match*" not in md
    assert "match compares every turn's text" in md
    assert "| ngram-table | code-edit |" in printed


def test_a_server_that_dies_is_a_row_and_the_run_goes_on(tmp_path, monkeypatch, capsys, fake_server):
    started = []
    monkeypatch.setattr(serving, "server_command", modes(
        fake_server, started, lambda c: "die" if c.label == "suffix-table" else ("plain" if c.is_baseline else "spec")))
    monkeypatch.setattr(serving, "suffix_available", lambda: True)
    out = tmp_path / "out"
    args = parse_bench_args(
        "--workload", "rag", "--model", "fake-model", "--configs", "none", "suffix-table", "ngram",
        "--sessions", "1", "--turns", "2", "--max-tokens", "4", "--warmup", "0", "--dtype", "bfloat16",
        "--out", str(out), "--server-timeout", "60")
    assert bench.run(args) == 1
    captured = capsys.readouterr()
    result = json.loads((out / "results.json").read_text())
    assert {c["label"]: c["status"] for c in result["configs"]} == {"none": "ok", "suffix-table": "failed",
                                                                     "ngram": "ok"}
    note = next(c["note"] for c in result["configs"] if c["label"] == "suffix-table")
    assert "the vLLM server died during the rag workload" in note
    assert "AssertionError in propose (vllm/v1/spec_decode/suffix_decoding.py:43)" in note
    md = (out / "results.md").read_text()
    died = next(line for line in md.splitlines() if line.startswith("| suffix-table |"))
    assert died.startswith("| suffix-table | server died: AssertionError in propose "
                           "(vllm/v1/spec_decode/suffix_decoding.py:43): assert num_speculative_tokens == ")
    assert "| ngram | rag |" in md
    # bfloat16: the match column says why it may not match, and how to check identity.
    assert "match*" in md and "run with `--dtype float32` for an identity check" in md
    assert "not expected to hold in bfloat16" in md
    assert "--dtype float32" in captured.out and "server died:" in captured.out


def test_workload_options_that_do_not_apply_are_refused(tmp_path, capsys):
    for extra, message in ((["--interleave"], "--interleave is for Spec-Bench"),
                           (["--repeats", "2"], "--repeats is for Spec-Bench"),
                           (["--base-url", "http://127.0.0.1:9", "--label", "x", "--repeat-traffic", "restart"],
                            "only 'same' and 'tenant'")):
        args = parse_bench_args("--workload", "rag", "--model", "m", "--out", str(tmp_path / "out"), *extra)
        assert bench.run(args) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_specbench_stays_the_default_and_runs_alone(tmp_path, capsys):
    args = parse_bench_args("--workload", "specbench", "rag", "--model", "m", "--out", str(tmp_path / "out"))
    assert bench.run(args) == 2
    assert "runs alone" in capsys.readouterr().err
    assert parse_bench_args().workload == ["specbench"]


def _bodies(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_passes(tmp_path, monkeypatch, fake_server, workload: str, *modes_given: str):
    """One fake-server run of ``workload`` (a session of two turns) with ``--repeat-traffic modes_given``: the
    request bodies sent, the configs of the servers started, their memory shares, and the output folder."""
    bodies = tmp_path / "bodies.jsonl"
    monkeypatch.setenv("FAKE_SERVER_BODIES", str(bodies))
    started, shares = [], []
    monkeypatch.setattr(serving, "server_command", modes(fake_server, started, lambda c: "plain", shares))
    monkeypatch.setattr(server, "available_ram_fraction", lambda: 0.9)
    monkeypatch.setattr(runner, "server_command", serving.server_command)
    out = tmp_path / "out"
    args = parse_bench_args(
        "--workload", workload, "--model", "fake-model", "--configs", "none", "--sessions", "1", "--turns", "2",
        "--max-tokens", "4", "--warmup", "1", "--dtype", "float32", "--out", str(out), "--server-timeout", "60",
        "--repeat-traffic", *modes_given)
    assert bench.run(args) == 0
    return _bodies(bodies), started, shares, out


def test_tenant_pass_runs_right_after_the_first_with_another_cache_salt(tmp_path, monkeypatch, fake_server):
    # tenant named last: it still runs right after the first pass, before the server is restarted.
    sent, started, _, out = run_passes(tmp_path, monkeypatch, fake_server, "rag", "restart", "replica", "tenant",
                                       "same")
    a, b = "bench-tenant-a", "bench-tenant-b"
    salts = [body.get("cache_salt", "absent") for body in sent]
    # warm-up (no salt: it teaches neither tenant), first, tenant, restart's warm-up and pass, replica's, same
    assert salts == ["absent", a, a, b, b, "absent", a, a, "absent", a, a, a, a]
    result = json.loads((out / "results.json").read_text())
    assert [(r["pass"], r["cache_salt"]) for r in result["requests"]] == [
        ("first", a), ("first", a), ("tenant", b), ("tenant", b), ("restart", a), ("restart", a),
        ("replica", a), ("replica", a), ("same", a), ("same", a)]
    assert started == ["none", "none"]  # the tenant pass starts no server; the replica does
    md = (out / "results.md").read_text()
    assert ("`rag · tenant`: the same sessions again on the same server from another tenant (another "
            "cache_salt): what one tenant's traffic gives another.") in md
    assert md.index("| none | rag · tenant |") < md.index("| none | rag · restart |")


def test_cold_tenant_is_a_third_tenant_on_a_fresh_server_after_other_material(tmp_path, monkeypatch,
                                                                              fake_server):
    sent, started, shares, out = run_passes(tmp_path, monkeypatch, fake_server, "code-edit", "cold-tenant",
                                            "tenant")
    a, b, c = "bench-tenant-a", "bench-tenant-b", "bench-tenant-c"
    # warm-up, first, tenant; then the second server's warm-up, other material as the first tenant, the
    # measured sessions as a third tenant
    assert [body.get("cache_salt", "absent") for body in sent] == ["absent", a, a, b, b, "absent", a, a, c, c]
    first_turn = [next(m["content"] for m in body["messages"] if m["role"] == "user") for body in sent]
    assert first_turn[1] == first_turn[3] == first_turn[8]  # the same sessions measured in every pass
    assert first_turn[6] != first_turn[1]  # the other material is another file
    assert started == ["none", "none"] and shares[0] == shares[1] < 0.9  # two servers up: each a share
    result = json.loads((out / "results.json").read_text())
    assert [(r["pass"], r["cache_salt"]) for r in result["requests"]] == [
        ("first", a), ("first", a), ("tenant", b), ("tenant", b), ("cold-tenant", c), ("cold-tenant", c)]
    assert [s["role"] for s in result["configs"][0]["servers"][1:]] == ["cold-tenant"]
    md = (out / "results.md").read_text()
    assert "`code-edit · cold-tenant`: the same sessions from a third tenant on a second, fresh server" in md
    assert md.index("| none | code-edit · tenant |") < md.index("| none | code-edit · cold-tenant |")


def test_no_cache_salt_without_tenant_and_tenant_works_with_base_url(tmp_path, monkeypatch, fake_server):
    def no_server(*args):
        raise AssertionError("--base-url starts no server")

    bodies = tmp_path / "bodies.jsonl"
    monkeypatch.setenv("FAKE_SERVER_BODIES", str(bodies))
    monkeypatch.setattr(serving, "server_command", no_server)
    proc, url = start_fake_server(fake_server, "plain")
    common = ("--workload", "rag", "--base-url", url, "--label", "none", "--sessions", "1", "--turns", "2",
              "--max-tokens", "4", "--warmup", "1")
    try:
        assert bench.run(parse_bench_args(*common, "--repeat-traffic", "same", "--out", str(tmp_path / "o1"))) == 0
        without = _bodies(bodies)
        bodies.unlink()
        assert bench.run(parse_bench_args(*common, "--repeat-traffic", "same", "tenant",
                                          "--out", str(tmp_path / "o2"))) == 0
        with_tenant = _bodies(bodies)
    finally:
        proc.kill()
        proc.wait()
    assert len(without) == 5 and not any("cache_salt" in body for body in without)  # sent exactly as before
    first = json.loads((tmp_path / "o1" / "results.json").read_text())
    assert not any("cache_salt" in r for r in first["requests"])
    a, b = "bench-tenant-a", "bench-tenant-b"
    assert [body.get("cache_salt", "absent") for body in with_tenant] == ["absent", a, a, b, b, a, a]


def test_pass_order_and_salts_are_decided_in_one_place():
    assert runner.pass_order(["restart", "same", "tenant", "replica"]) == ["tenant", "restart", "same", "replica"]
    assert runner.pass_order(["restart", "same"]) == ["restart", "same"]
    for mode in (None, "same", "restart", "replica"):
        assert runner.cache_salt(mode, ["same", "restart", "replica"]) is None
        assert runner.cache_salt(mode, ["tenant"]) == "bench-tenant-a"
    assert runner.cache_salt("tenant", ["tenant"]) == "bench-tenant-b"
    assert runner.cache_salt("cold-tenant", ["cold-tenant"]) == "bench-tenant-c"
    assert runner.cache_salt(None, ["cold-tenant"]) == "bench-tenant-a"
    assert runner.pass_order(["cold-tenant", "restart", "tenant"]) == ["tenant", "restart", "cold-tenant"]


def test_unknown_repeat_traffic_modes_are_still_refused(capsys):
    with pytest.raises(BenchError, match="--repeat-traffic: unknown mode tenants; choose from .*tenant"):
        runner.check_options(BenchOptions(workload=["rag"], repeat_traffic=["tenant", "tenants"]))
    with pytest.raises(SystemExit):
        parse_bench_args("--workload", "rag", "--repeat-traffic", "tenants")
    assert "--repeat-traffic" in capsys.readouterr().err


def test_a_replica_is_stopped_before_the_cold_tenant_server_starts(tmp_path, monkeypatch, fake_server):
    servers, most_up = [], []
    start = server.Server.start

    def counting_start(self):
        servers.append(self)
        most_up.append(1 + sum(s.proc is not None and s.proc.poll() is None for s in servers if s is not self))
        return start(self)

    monkeypatch.setattr(server.Server, "start", counting_start)
    _, started, shares, _ = run_passes(tmp_path, monkeypatch, fake_server, "rag", "replica", "cold-tenant")
    assert started == ["none"] * 3 and max(most_up) == 2  # each of the two second servers beside the first only
