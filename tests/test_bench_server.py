"""The server a benchmark measures: the command it starts, its log's root cause, stopping it, a running one."""
from __future__ import annotations

import json
import os

import pytest
from bench_helpers import FAKE_SERVER, start_fake_server

from freespec.bench import server
from freespec.bench.configs import parse_config_spec
from freespec.bench.errors import BenchError
from freespec.bench.memory import available_ram_fraction, node_ram_total_gib, ram_total_gib, weights_gib
from freespec.bench.options import BenchOptions
from freespec.bench.serving import slug


def test_server_command_uses_freespec_vllm_cli():
    options = BenchOptions(dtype="float32", max_model_len=2048, gpu_memory_utilization=0.3, seed=0,
                           server_args="--max-num-seqs 4")
    config = parse_config_spec("ngram", 8)
    cmd = server.server_command("/models/m", 8123, config, options, cpu=False)
    assert cmd[1:5] == ["-m", "freespec.vllm_plugins.vllm_cli", "serve", "/models/m"]
    assert cmd[cmd.index("--port") + 1] == "8123" and cmd[cmd.index("--dtype") + 1] == "float32"
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.3"
    assert json.loads(cmd[cmd.index("--speculative-config") + 1]) == config.speculative_config
    assert cmd[-2:] == ["--max-num-seqs", "4"]
    baseline_cmd = server.server_command("/m", 1, parse_config_spec("none", 8), options, cpu=False)
    assert "--speculative-config" not in baseline_cmd


def test_every_cpu_server_shares_one_compile_cache_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    stock, fixes = parse_config_spec("suffix", 8), parse_config_spec("suffix+fixes", 8)
    assert server.server_env(stock, cpu=True) == {"VLLM_USE_AOT_COMPILE": "0", **stock.env}
    assert server.server_env(fixes, cpu=True) == {"VLLM_USE_AOT_COMPILE": "0", **fixes.env}
    assert server.server_env(stock, cpu=False) == stock.env  # a GPU build keeps vLLM's own compile cache
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    assert server.server_env(stock, cpu=True) == stock.env  # the user's setting reaches the server


def test_memory_share_defaults_fit_the_build(monkeypatch):
    config = parse_config_spec("none", 8)
    monkeypatch.setattr(server, "available_ram_fraction", lambda: 0.9)

    def share(options, cpu):
        cmd = server.server_command("/m", 1, config, options, cpu)
        return cmd[cmd.index("--gpu-memory-utilization") + 1] if "--gpu-memory-utilization" in cmd else None

    # A CPU build reserves this share of RAM; vLLM's own 0.92 would refuse to start on a busy machine.
    assert share(BenchOptions(), cpu=True) == str(server.CPU_MEMORY_SHARE)
    assert share(BenchOptions(), cpu=False) is None  # a GPU: vLLM's own default
    assert share(BenchOptions(gpu_memory_utilization=0.5), cpu=True) == "0.5"
    assert share(BenchOptions(gpu_memory_utilization=0.5), cpu=False) == "0.5"
    monkeypatch.setattr(server, "available_ram_fraction", lambda: 0.2)  # a busy machine: 20% of RAM free
    assert share(BenchOptions(), cpu=True) == "0.16"


def test_memory_share_on_a_cpu_stays_below_the_free_ram():
    assert server.memory_share(None, cpu=True, free=None) == server.CPU_MEMORY_SHARE  # unknown: the default
    assert server.memory_share(None, cpu=True, free=0.9) == server.CPU_MEMORY_SHARE
    assert server.memory_share(None, cpu=True, free=0.227) == 0.18  # 0.8 of the free share, rounded down
    assert server.memory_share(None, cpu=True, free=0.0) == 0.01
    assert server.memory_share(0.7, cpu=True, free=0.1) == 0.7  # the user's value is passed as given


def test_a_model_larger_than_the_default_share_gets_what_its_weights_need(tmp_path, monkeypatch):
    # A 1.5B model in bfloat16 (3.3 GiB) did not start in the fixed 0.3 of a 17.3 GiB node (run 2026-11-29).
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    with (model / "model.safetensors").open("wb") as fh:
        fh.truncate(3 * 2**30)  # sparse: 3 GiB of bfloat16 weights
    assert weights_gib(str(model), "bfloat16") == 3.0
    assert weights_gib(str(model), "auto") == 3.0
    assert weights_gib(str(model), "float32") == 6.0
    assert weights_gib("Qwen/Qwen2.5-Coder-1.5B-Instruct", "bfloat16") is None  # a model id: unknown
    assert weights_gib(str(model), "int4") is None
    monkeypatch.setattr(server, "node_ram_total_gib", lambda: 20.0)
    # (3 + 2.5 + 1) / 20 = 0.325, rounded up; float32 (6 + 3.5) / 20
    assert server.model_share(str(model), "bfloat16") == 0.33
    assert server.model_share(str(model), "float32") == 0.48
    assert server.model_share(str(tmp_path / "absent"), "bfloat16") is None
    assert server.memory_share(None, cpu=True, free=0.9, need=0.48) == 0.48
    assert server.memory_share(None, cpu=True, free=0.9, need=0.1) == server.CPU_MEMORY_SHARE  # small: the default
    assert server.memory_share(None, cpu=True, free=0.5, need=0.48) == 0.4  # never more than 0.8 of what is free
    assert server.memory_share(0.2, cpu=True, free=0.9, need=0.48) == 0.2  # the user's value is passed as given
    assert server.memory_share(None, cpu=False, free=0.9, need=0.48) is None
    monkeypatch.setattr(server, "available_ram_fraction", lambda: 0.9)
    cmd = server.server_command(str(model), 1, parse_config_spec("none", 8), BenchOptions(dtype="float32"), True)
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.48"


def test_node_ram_total_gib_reads_the_nodes_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("Node 0 MemTotal:       20408524 kB\nNode 0 MemFree:        11636152 kB\n")
    assert node_ram_total_gib(meminfo) == 20408524 / 2**20
    assert node_ram_total_gib(tmp_path / "absent") is None


def test_interleaved_servers_split_the_free_memory_after_each_servers_overhead(monkeypatch):
    monkeypatch.setattr(server, "available_ram_fraction", lambda: 0.9)
    monkeypatch.setattr(server, "ram_total_gib", lambda: 23.5)
    options = BenchOptions()
    # (0.8 * 0.9 - 4 * 1.5 / 23.5) / 4 = 0.116: 2.6 GiB each, where 0.3 / 4 (1.6 GiB) left a float32
    # SmolLM2 server no KV cache (interleave-float32); 4 * (2.6 + 1.5) GiB fit in the 21 GiB free
    assert server.interleaved_options(options, 4, cpu=True)[0].gpu_memory_utilization == 0.11
    assert server.interleaved_options(options, 2, cpu=True)[0].gpu_memory_utilization == 0.29  # (0.72 - 0.128) / 2
    monkeypatch.setattr(server, "ram_total_gib", lambda: 256.0)  # a large machine: at most one server's 0.3
    assert server.interleaved_options(options, 2, cpu=True)[0].gpu_memory_utilization == server.CPU_MEMORY_SHARE
    monkeypatch.setattr(server, "ram_total_gib", lambda: None)  # RAM unknown: 1/N of one server's share
    assert server.interleaved_options(options, 4, cpu=True)[0].gpu_memory_utilization == 0.07
    assert server.interleaved_options(options, 4, cpu=False)[0].gpu_memory_utilization == 0.23  # vLLM's 0.92 / 4
    assert server.interleaved_options(options, 1, cpu=True) == (options, None)  # one server: as without --interleave
    given = BenchOptions(gpu_memory_utilization=0.05)
    assert server.interleaved_options(given, 4, cpu=True) == (given, None)  # a given share is each server's
    monkeypatch.setattr(server, "available_ram_fraction", lambda: 0.02)
    monkeypatch.setattr(server, "ram_total_gib", lambda: 23.5)
    assert server.interleaved_options(options, 4, cpu=True)[0].gpu_memory_utilization == 0.01  # never 0


def test_interleaved_servers_of_a_large_model_get_what_it_needs_or_a_note(tmp_path, monkeypatch):
    # Two Qwen2.5-Coder-1.5B bfloat16 servers (--repeat-traffic replica) each got the small model's 0.3 and
    # could not start; now each gets the model's need where the room allows, and a note says where it does not.
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    for total in ("node_ram_total_gib", "ram_total_gib"):
        monkeypatch.setattr(server, total, lambda: 20.0)
    monkeypatch.setattr(server, "available_ram_fraction", lambda: 1.0)
    options = BenchOptions(dtype="bfloat16")

    def model_of(gib: float) -> str:
        model = tmp_path / f"model-{gib}"
        model.mkdir()
        (model / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
        with (model / "model.safetensors").open("wb") as fh:
            fh.truncate(int(gib * 2**30))  # sparse
        return str(model)

    fits, short = model_of(2.6), model_of(3.0)  # need (2.6 + 3.5) / 20 -> 0.31; (3 + 3.5) / 20 -> 0.33
    # room: (0.8 * 1.0 - 2 * 1.5 / 20) / 2 = 0.325 each
    assert server.interleaved_options(options, 2, True, fits)[0].gpu_memory_utilization == 0.31
    assert server.interleaved_options(options, 2, True, fits)[1] is None
    assert server.interleaved_options(options, 2, True, short)[0].gpu_memory_utilization == 0.32
    note = server.interleaved_options(options, 2, True, short)[1]
    assert note is not None and "0.32" in note and "0.33" in note and "--gpu-memory-utilization" in note
    assert server.interleaved_options(options, 2, True)[0].gpu_memory_utilization == server.CPU_MEMORY_SHARE
    assert server.interleaved_options(options, 1, True, short)[1] is None  # one server: memory_share's need
    assert server.interleaved_options(BenchOptions(gpu_memory_utilization=0.2), 2, True, short)[1] is None
    assert server.interleaved_options(options, 2, False, short)[1] is None  # a GPU: vLLM sizes its own
    # a KV cache of a given size: vLLM's CPU worker does not use the share, so no note (session 63's replica)
    sized = BenchOptions(dtype="bfloat16", server_args="--kv-cache-memory-bytes=536870912")
    assert server.interleaved_options(sized, 2, True, short)[1] is None
    sized = BenchOptions(dtype="bfloat16", server_args="--kv_cache_memory_bytes 536870912")  # vLLM reads _ as -
    assert server.interleaved_options(sized, 2, True, short)[1] is None
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    assert server.interleaved_options(options, 2, True, short)[1] is None


def test_available_ram_fraction_reads_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:    6000000 kB\n")
    assert available_ram_fraction(meminfo) == 0.25
    assert available_ram_fraction(tmp_path / "absent") is None
    assert ram_total_gib(meminfo) == 24000000 / 2**20
    assert ram_total_gib(tmp_path / "absent") is None


def test_log_failure_hint_finds_the_root_cause():
    log = (
        "(APIServer pid=1) WARNING [system_utils.py:255] can cause `OSError: [Errno 24] Too many open files`.\n"
        "(VllmWorker-0 pid=2) ERROR [multiproc_executor.py:953] Traceback (most recent call last):\n"
        "(VllmWorker-0 pid=2) ERROR [multiproc_executor.py:953] ValueError: Available memory is too low.\n"
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n"
        "RuntimeError: Engine core initialization failed. See root cause above."
    )
    assert server.log_failure_hint(log) == "ValueError: Available memory is too low."
    assert server.log_failure_hint(log.splitlines()[-1]) is None
    assert server.log_failure_hint("all good\n") is None


def test_server_log_names_of_long_labels_do_not_collide():
    a = slug('hybrid:{"sources":["copy","recycle","retrieval"],"datastore":"/data/ds","policy":"fixed"}')
    b = slug('hybrid:{"sources":["copy","recycle","retrieval"],"datastore":"/data/ds","policy":"goodput"}')
    assert a != b and len(a) <= 60 and len(b) <= 60
    assert slug("none") == "none" and slug('copy:{"min_match":3}') == "copy_min_match_3"


def test_first_model_of_a_models_listing():
    assert server.first_model('{"object": "list", "data": [{"id": "m1"}, {"id": "m2"}]}') == "m1"
    for bad in ('{"data": []}', "not json", '{"error": "x"}'):
        with pytest.raises(BenchError, match="lists no model"):
            server.first_model(bad)


def test_running_server_reads_counters_and_treats_a_missing_metrics_page_as_none(tmp_path, monkeypatch):
    monkeypatch.setattr(server, "METRICS_SETTLE_S", 0.01)
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    proc, url = start_fake_server(script, "spec")
    try:
        running = server.RunningServer(url + "/")
        assert running.base_url == url
        assert running.spec_counters() == {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0}
        # A server without /metrics (a proxy in front of vLLM): blank acceptance figures, not a failure.
        monkeypatch.setattr(server, "http_get", lambda u, timeout: (_ for _ in ()).throw(
            server.urllib.error.HTTPError(u, 404, "Not Found", {}, None)))
        assert running.spec_counters() is None
    finally:
        proc.kill()
        proc.wait()


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
from freespec.bench.run import sigterm_as_interrupt
from freespec.bench.server import Server
with sigterm_as_interrupt():
    server = Server(["sleep", "600"], 0, Path({str(tmp_path / 'log')!r}))
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
