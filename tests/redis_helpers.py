"""A real ``redis-server`` for the tests (Debian's package; ``scripts/setup.sh`` installs it): started on a free
loopback port in its own folder, nothing saved (``--save '' --appendonly no``), stopped at the end. Tests that
need it skip, saying why, where ``redis-server`` or the ``redis`` client is missing. Never a mock."""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One ``redis-server`` process; ``stop``/``start`` (same port, restarted empty), ``pause``/``resume``
    (SIGSTOP/SIGCONT), ``client()`` for the test's own commands."""

    def __init__(self, folder: Path, *extra: str) -> None:
        self.folder, self.extra = folder, extra
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None
        self.password = next((extra[i + 1] for i, a in enumerate(extra) if a == "--requirepass"), None)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        self.folder.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.folder), *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if self.client().ping():
                    return self
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def client(self):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=5)

    def stop(self) -> None:
        if self.proc is not None:
            self.resume()
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)


def redis_missing() -> str | None:
    """Why the Redis tests cannot run here, or None."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed (scripts/setup.sh installs Debian's redis-server where it can)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the redis client is not installed (pip install 'vllm-freespec[fleet]')"
    return None


@pytest.fixture
def redis_server(tmp_path):
    why = redis_missing()
    if why:
        pytest.skip(why)
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def wait_until(check, timeout: float = 10.0, every: float = 0.02):
    """``check()``'s first truthy value within ``timeout`` seconds, else its last value."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(every)


__all__ = ["RedisServer", "redis_missing", "redis_server", "wait_until"]
