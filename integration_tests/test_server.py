"""`vllm serve` with a freespec plugin: the OpenAI server as a subprocess on 127.0.0.1."""
from __future__ import annotations

import subprocess

import pytest

from freespec.bench.errors import BenchError
from integration_tests.conftest import COPY_HEAVY
from integration_tests.serving import free_port, metric, serve_args, start_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(model_path, tmp_path_factory):
    spec = {"plugin": "copy", "num_speculative_tokens": 6, "min_match": 2}
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
