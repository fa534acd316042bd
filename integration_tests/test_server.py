"""`vllm serve` with a freespec plugin: the OpenAI server as a subprocess on 127.0.0.1."""
from __future__ import annotations

import json
import subprocess

import pytest

from freespec.bench.errors import BenchError
from integration_tests.conftest import COPY_HEAVY
from integration_tests.serving import chat, free_port, metric, scrape, serve_args, start_server, value

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(model_path, tmp_path_factory):
    """`freespec serve` with the copy plugin, shared by the module's tests (one server start)."""
    spec = {"plugin": "copy", "num_speculative_tokens": 6, "min_match": 2}
    with pytest.MonkeyPatch.context() as env:
        env.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)  # freespec serve makes a fresh one
        env.delenv("FREESPEC_METRICS", raising=False)
        try:
            server = start_server(model_path, spec, tmp_path_factory.mktemp("server") / "server.log")
        except BenchError as e:
            pytest.fail(str(e))
    try:
        yield server
    finally:
        server.stop()


def test_vllm_serve_with_copy_plugin_answers_chat_completions(server, model_path):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.base_url}/v1", api_key="none")
    reply = client.chat.completions.create(
        model=model_path, messages=[{"role": "user", "content": COPY_HEAVY}], max_tokens=100, temperature=0
    )
    text = reply.choices[0].message.content
    assert "def load(path)" in text
    assert metric(server, "vllm:spec_decode_num_accepted_tokens_total") > 0


def test_bad_plugin_option_makes_vllm_serve_exit_with_the_field_named(model_path):
    proc = subprocess.run(
        serve_args(model_path, free_port(), {"plugin": "copy", "num_speculative_tokens": 4, "colour": "red"}),
        check=False, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode != 0
    assert "unknown option 'colour'" in proc.stderr + proc.stdout


def test_unknown_plugin_makes_vllm_serve_exit_listing_the_plugins(model_path):
    proc = subprocess.run(
        serve_args(model_path, free_port(), {"plugin": "telepathy", "num_speculative_tokens": 4}),
        check=False, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode != 0
    out = proc.stderr + proc.stdout
    assert "unknown freespec plugin 'telepathy'" in out and "copy" in out


def test_bench_measures_a_running_server_through_base_url(server, model_path, tmp_path):
    """`freespec bench --base-url URL --label copy` against the real server: streamed requests with their
    latency figures, and the acceptance counters read from its /metrics."""
    from freespec.bench.options import BenchOptions
    from freespec.bench.run import run

    options = BenchOptions(base_url=[server.base_url], label=["copy"], questions="builtin",
                           categories="coding,extraction", per_category=[1], max_tokens=48, warmup=1,
                           out=str(tmp_path / "out"), request_timeout=300)
    assert run(options, argv=["freespec", "bench"]) == 0
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    assert result["status"] == "complete" and result["settings"]["model"] == model_path
    requests = result["requests"]
    assert len(requests) == 2 and all(r["error"] is None for r in requests)
    assert all(0 < r["ttft_s"] < r["latency_s"] and r["completion_tokens"] > 1 and r["tpot_s"] > 0 for r in requests)
    row = next(r for r in result["aggregates"] if r["category"] == "all")
    # The acceptance figures come from the server's /metrics (counter deltas over the measured blocks).
    assert row["num_drafts"] > 0 and row["num_draft_tokens"] > 0 and row["acceptance_rate"] is not None
    assert row["mean_tpot_ms"] > 0 and row["p99_itl_ms"] >= row["p50_itl_ms"]


def test_counters_move_as_drafts_are_accepted(server, model_path):
    """freespec's metrics on `freespec serve`'s /metrics: written in the engine's worker, collected by the API
    server (the module's server, after the other tests' requests: counters are read as deltas)."""
    before = scrape(server)
    assert value(before, "freespec:plugin_enabled", plugin="copy") == 1  # set in the worker at engine start
    chat(server, model_path, 100)
    after = scrape(server)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # Padding ("pad", docs/policy.md) is counted as its own source; vLLM counts it with the rest.
    drafted = delta("freespec:draft_tokens_total", plugin="copy")
    accepted = delta("freespec:accepted_tokens_total", plugin="copy")
    assert delta("freespec:draft_tokens_total", plugin="copy", source="copy") > 0
    vllm_accepted = delta("vllm:spec_decode_num_accepted_tokens_total")
    print(f"freespec drafted {drafted:.0f} accepted {accepted:.0f}; vLLM accepted {vllm_accepted:.0f}")
    assert drafted > 0 and accepted > 0 and accepted <= drafted
    # The adapter judges a draft at the next step, so the request's last step is vLLM's alone.
    assert vllm_accepted - 6 <= accepted <= vllm_accepted
    assert delta("freespec:steps_total", plugin="copy", drafted="yes") > 0
    assert delta("freespec:propose_seconds_count", plugin="copy") == delta("freespec:steps_total", plugin="copy")
    assert value(after, "freespec:errors_total", plugin="copy") == 0
    assert value(after, "freespec:plugin_enabled", plugin="copy") == 1
