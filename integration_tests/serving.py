"""Start and stop `vllm serve` as a subprocess on 127.0.0.1 (shared by the server tests)."""
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

from freespec.cli.process_memory import process_tree  # noqa: F401  (re-exported for the tests)


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


def start_server(model: str, spec: dict, log_path: Path, memory: float = 0.3) -> tuple[subprocess.Popen, int]:
    """`vllm serve MODEL --speculative-config SPEC` in its own process group; (process, port) once healthy.

    Raises RuntimeError with the end of the log if it exits or is not healthy within 600 s.
    """
    port = free_port()
    args = serve_args(model, port, spec)
    args[args.index("--gpu-memory-utilization") + 1] = str(memory)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 600
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc, port
        except OSError:
            if time.time() > deadline:
                stop(proc)
                raise RuntimeError(f"vllm serve was not healthy within 600 s:\n{log_path.read_text()[-4000:]}")
            time.sleep(2)
