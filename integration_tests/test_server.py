"""`vllm serve` with a freespec plugin: the OpenAI server as a subprocess on 127.0.0.1."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from integration_tests.conftest import COPY_HEAVY

pytestmark = pytest.mark.integration


def vllm_command() -> str:
    """The `vllm` command of the environment running the tests (freespec's, which works on CPU)."""
    path = Path(sys.executable).with_name("vllm")
    return str(path) if path.exists() else shutil.which("vllm")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_args(model: str, port: int, spec: dict) -> list[str]:
    return [
        vllm_command(), "serve", model, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--max-model-len", "2048", "--gpu-memory-utilization", "0.3", "--enforce-eager",
        "--speculative-config", json.dumps(spec),
    ]


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))


@pytest.fixture(scope="module")
def server(model_path, tmp_path_factory):
    port = free_port()
    log = (tmp_path_factory.mktemp("server") / "server.log").open("w")
    proc = subprocess.Popen(
        serve_args(model_path, port, {"plugin": "copy", "num_speculative_tokens": 6, "min_match": 2}),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.time() + 600
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{Path(log.name).read_text()[-4000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if time.time() > deadline:
                    pytest.fail("vllm serve did not become healthy in 600 s")
                time.sleep(2)
        yield port
    finally:
        stop(proc)
        log.close()


def stop(proc: subprocess.Popen) -> None:
    """Stop the server and every process it started (it runs in its own process group)."""
    for sig, wait in ((15, 60), (9, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def test_vllm_serve_with_copy_plugin_answers_chat_completions(server, model_path):
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{server}/v1", api_key="none")
    reply = client.chat.completions.create(
        model=model_path, messages=[{"role": "user", "content": COPY_HEAVY}], max_tokens=100, temperature=0
    )
    text = reply.choices[0].message.content
    assert "def load(path)" in text
    assert metric(server, "vllm:spec_decode_num_accepted_tokens_total") > 0


def test_bad_plugin_option_makes_vllm_serve_exit_with_the_field_named(model_path):
    proc = subprocess.run(
        serve_args(model_path, free_port(), {"plugin": "copy", "num_speculative_tokens": 4, "colour": "red"}),
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode != 0
    assert "unknown option 'colour'" in proc.stderr + proc.stdout


def test_unknown_plugin_makes_vllm_serve_exit_listing_the_plugins(model_path):
    proc = subprocess.run(
        serve_args(model_path, free_port(), {"plugin": "telepathy", "num_speculative_tokens": 4}),
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode != 0
    out = proc.stderr + proc.stdout
    assert "unknown freespec plugin 'telepathy'" in out and "copy" in out
