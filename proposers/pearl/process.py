"""The ``pearl`` draft model in a child process (``placement: "process"``, the default).

Why a process: a draft *thread* inside vLLM's worker shares the worker's GIL.
The eager transformers forward makes hundreds of Python-level op calls per
token; each drops and re-takes the GIL, and the target's thread queues behind
them (docs/pearl.md measures what that costs the target's step, against a
separate process). In its own process the draft has its own interpreter.

``DraftProcess`` has the interface of ``draft.DraftWorker`` (``step``,
``release``, ``wait_idle``, ``close``) plus ``bind`` and ``stats``. The child
runs an ordinary ``DraftWorker`` (draft model, drafter, post-verify thread):
its main thread only reads the pipe, so post-verify goes on in the child while
vLLM verifies, exactly as in the thread placement.

The child is started with ``subprocess.Popen`` (fork+exec of this Python,
``python -m freespec.proposers.pearl.process FD``), not ``multiprocessing``:

- its environment must differ from the worker's. vLLM's CPU worker sets
  ``OMP_PLACES``/``OMP_PROC_BIND`` (or ``KMP_AFFINITY``/``GOMP_CPU_AFFINITY``)
  to the *target's* cores; an OpenMP runtime that reads them in the child binds
  the draft's threads there, whatever affinity the child sets. ``Popen`` takes an
  environment; ``multiprocessing`` would need ``os.environ`` changed in a
  process that already runs threads;
- ``multiprocessing``'s spawn re-imports the parent's ``__main__`` (vLLM's CLI).

The child pins itself to ``draft_cores`` before it imports torch, so OpenMP's
threads inherit the mask.

This module is only the transport: messages (a JSON header and, for a step,
raw int32 bytes; nothing is unpickled), the child's message handling and the
failure rules are ``remote``'s, shared with the Ray placement:

- every reply is awaited with a timeout, checking that the child is alive;
  a child that dies or does not answer a step within ``step_timeout_s`` is
  killed and restarted in the background, with a back-off after repeated
  failures and a short timeout after one (``remote.RemoteDraft``);
- an exception inside the child's drafter comes back as an error reply and is
  raised by ``step`` (the adapter logs it once, that step drafts nothing); the
  child resets its draft state and keeps going;
- the child exits when its end of the pipe reaches EOF (the parent closed it or
  died), and ``close()`` (also registered with ``atexit``) ends it.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from typing import Optional

from freespec.proposers.pearl.remote import DraftError, DraftServer, DraftTimeout, RemoteDraft

logger = logging.getLogger("freespec")

# OpenMP affinity variables vLLM's CPU worker sets for the target's cores (vllm/utils/ompmultiprocessing.py).
AFFINITY_ENV = ("OMP_PLACES", "OMP_PROC_BIND", "KMP_AFFINITY", "GOMP_CPU_AFFINITY")
POLL_S = 0.2  # how often a wait checks that the child is alive
DraftProcessError = DraftError  # the name this module used before the Ray placement shared it


def child_env(threads: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in AFFINITY_ENV}
    env["OMP_NUM_THREADS"] = str(threads)
    return env


def _send(conn: Connection, header: dict, payload: Optional[bytes] = None) -> None:
    conn.send_bytes(json.dumps(header).encode())
    if payload is not None:
        conn.send_bytes(payload)


def _recv(conn: Connection) -> dict:
    return json.loads(conn.recv_bytes().decode())


class DraftProcess(RemoteDraft):
    """The parent's handle on the draft child: ``RemoteDraft`` over a socket pair; see the module docstring."""

    kind = "draft process"

    def __init__(self, spec: dict, *, step_timeout_s: float = 30.0, max_restarts: int = 3) -> None:
        super().__init__(spec, step_timeout_s=step_timeout_s, max_restarts=max_restarts)
        self._proc: Optional[subprocess.Popen] = None
        self._conn: Optional[Connection] = None

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    def _launch(self) -> None:
        parent, child = socket.socketpair()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "freespec.proposers.pearl.process", str(child.fileno())],
                pass_fds=(child.fileno(),),
                env=child_env(int(self.spec.get("threads", 1))),
                stdin=subprocess.DEVNULL,
            )
        finally:
            child.close()
        self._conn = Connection(parent.detach())
        self._ready = False
        self._tell({"op": "start", "spec": self.spec})

    def _launched(self) -> bool:
        return self._conn is not None and self._proc is not None

    def _poll_ready(self, timeout: float) -> Optional[dict]:
        return self._wait_reply(timeout, "start", none_on_timeout=True)

    def _call(self, msg: dict, payload: Optional[bytes], timeout: float, what: str) -> dict:
        if self._conn is None:
            raise DraftError("pearl: no draft process")
        try:
            _send(self._conn, msg, payload)
        except OSError as e:
            raise DraftError(f"pearl: the draft process's pipe failed during {what} ({e!r})") from e
        return self._wait_reply(timeout, what)

    def _tell(self, msg: dict) -> None:
        try:
            _send(self._conn, msg)
        except (OSError, AttributeError) as e:
            raise DraftError(f"pearl: cannot reach the draft process ({e!r})") from e

    def _wait_reply(self, timeout: float, what: str, none_on_timeout: bool = False) -> Optional[dict]:
        """The child's next reply; DraftError if it dies or does not answer in time (or None, if asked)."""
        deadline = time.monotonic() + timeout
        conn, proc = self._conn, self._proc
        if conn is None or proc is None:
            raise DraftError("pearl: no draft process")
        while True:
            try:
                if conn.poll(min(POLL_S, max(0.0, deadline - time.monotonic()))):
                    return _recv(conn)
            except (EOFError, OSError) as e:
                raise DraftError(f"pearl: the draft process closed its pipe during {what} ({e!r})") from e
            if proc.poll() is not None:
                raise DraftError(f"pearl: the draft process exited with code {proc.returncode} during {what}")
            if time.monotonic() >= deadline:
                if none_on_timeout:
                    return None
                raise DraftTimeout(f"pearl: the draft process did not answer {what} within {timeout:.0f} s")

    def _goodbye(self) -> None:
        if self._proc.poll() is None:
            _send(self._conn, {"op": "close"})
            self._proc.wait(timeout=5)

    def _kill(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc, self._conn, self._ready = None, None, False
        if conn is not None:
            conn.close()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


# --------------------------------------------------------------------------- the child


def _child_main(fd: int) -> None:
    conn = Connection(fd)
    try:
        first = _recv(conn)
    except EOFError:
        return
    spec = first["spec"]
    cores = spec.get("cores")
    if cores:
        try:
            # Before torch is imported: OpenMP's threads inherit this process's mask.
            os.sched_setaffinity(0, set(cores))
        except (AttributeError, OSError) as e:
            _send(conn, {"ok": False, "error": f"'draft_cores' {sorted(cores)} cannot be used by the draft process: "
                                              f"{e} (it may use {sorted(os.sched_getaffinity(0))})"})
            return
    server = DraftServer()
    ready = server.start(spec)
    _send(conn, ready)
    if not ready["ok"]:
        return
    try:
        while True:
            try:
                msg = _recv(conn)
                if msg["op"] == "close":
                    return
                payload = conn.recv_bytes() if msg["op"] == "step" else None
            except EOFError:
                return  # the parent closed its end or died
            reply = server.handle(msg, payload)
            if reply is not None:
                _send(conn, reply)
    finally:
        server.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s pearl-draft[%(process)d] %(levelname)s %(message)s")
    _child_main(int(sys.argv[1]))
