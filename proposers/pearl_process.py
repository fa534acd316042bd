"""The ``pearl`` draft model in a child process (``placement: "process"``, the default).

Why a process: a draft *thread* inside vLLM's worker shares the worker's GIL.
The eager transformers forward makes hundreds of Python-level op calls per
token; each drops and re-takes the GIL, and the target's thread queues behind
them (measured: +19% on the target's step time; a separate process: +1%,
docs/pearl.md). In its own process the draft has its own interpreter.

``DraftProcess`` has the interface of ``pearl_draft.DraftWorker`` (``step``,
``release``, ``wait_idle``, ``close``) plus ``bind`` and ``stats``. The child
runs an ordinary ``DraftWorker`` (draft model, drafter, post-verify thread):
its main thread only reads the pipe, so post-verify goes on in the child while
vLLM verifies, exactly as in the thread placement.

The child is started with ``subprocess.Popen`` (fork+exec of this Python,
``python -m freespec.proposers.pearl_process FD``), not ``multiprocessing``:

- its environment must differ from the worker's. vLLM's CPU worker sets
  ``OMP_PLACES``/``OMP_PROC_BIND`` (or ``KMP_AFFINITY``/``GOMP_CPU_AFFINITY``)
  to the *target's* cores; an OpenMP runtime that reads them in the child binds
  the draft's threads there, whatever affinity the child sets. ``Popen`` takes an
  environment; ``multiprocessing`` would need ``os.environ`` changed in a
  process that already runs threads;
- ``multiprocessing``'s spawn re-imports the parent's ``__main__`` (vLLM's CLI).

The child pins itself to ``draft_cores`` before it imports torch, so OpenMP's
threads inherit the mask.

Messages are plain: a JSON header (numbers, lists, strings), and for a step the
rows' token ids as raw int32 bytes. Nothing is unpickled.

Failure handling (vLLM must never hang on the draft):

- every reply is awaited with a timeout, checking that the child is alive;
- a child that dies, or does not answer a step within ``step_timeout_s``, is
  killed; that step drafts nothing, the error is logged once, and a new child
  is started in the background (at most ``max_restarts`` times; then pearl stays
  off). Until the new child is ready, steps draft nothing without waiting;
- an exception inside the child's drafter comes back as an error reply and is
  raised by ``step`` (the adapter logs it once, that step drafts nothing); the
  child resets its draft state and keeps going;
- the child exits when its end of the pipe reaches EOF (the parent closed it or
  died), and ``close()`` (also registered with ``atexit``) ends it.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import weakref
from multiprocessing.connection import Connection
from typing import Optional, Sequence

import numpy as np

from freespec.proposers.base import Row

logger = logging.getLogger("freespec")

# OpenMP affinity variables vLLM's CPU worker sets for the target's cores (vllm/utils/ompmultiprocessing.py).
AFFINITY_ENV = ("OMP_PLACES", "OMP_PROC_BIND", "KMP_AFFINITY", "GOMP_CPU_AFFINITY")
START_TIMEOUT_S = float(os.environ.get("FREESPEC_PEARL_START_TIMEOUT_S", "600"))  # import torch + load weights
POLL_S = 0.2  # how often a wait checks that the child is alive
GAUGES = ("weight_bytes", "kv_bytes", "cached_requests", "cached_tokens")  # in stats: now, not summed


class DraftProcessError(RuntimeError):
    pass


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


class DraftProcess:
    """The parent's handle on the draft child; see the module docstring."""

    def __init__(self, spec: dict, *, step_timeout_s: float = 30.0, max_restarts: int = 3) -> None:
        self.spec = dict(spec)  # plain JSON: model path, drafter options, cores, threads, device
        self.step_timeout_s = step_timeout_s
        self.max_restarts = max_restarts
        self.info: dict = {}  # what the child reported when ready (vocab_size, weight_bytes, ...)
        self.step_wait = 0.0  # seconds step() blocked, pipe included: the target waited for drafts
        self.restarts = 0
        self.deaths = 0
        self.skipped_steps = 0  # steps with no child ready: nothing drafted, nothing waited for
        self._child_stats: dict = {}  # the current child's counters, as of its last reply
        self._dead_stats: dict = {}  # counters of children that died, so stats() stays cumulative
        self._proc: Optional[subprocess.Popen] = None
        self._conn: Optional[Connection] = None
        self._ready = False
        self._off = False
        self._logged = False
        self._lock = threading.Lock()  # step/wait_idle/close may come from different threads
        atexit.register(_close_ref, weakref.ref(self))

    # -- life cycle -------------------------------------------------------------
    def start(self) -> None:
        """Start the child and wait until its model is loaded; raise with the child's error if it cannot."""
        self._launch()
        try:
            self._take_ready(self._wait_reply(START_TIMEOUT_S, "start"))
        except BaseException:
            self._kill()
            raise

    def _launch(self) -> None:
        parent, child = socket.socketpair()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "freespec.proposers.pearl_process", str(child.fileno())],
                pass_fds=(child.fileno(),),
                env=child_env(int(self.spec.get("threads", 1))),
                stdin=subprocess.DEVNULL,
            )
        finally:
            child.close()
        self._conn = Connection(parent.detach())
        self._ready = False
        _send(self._conn, {"op": "start", "spec": self.spec})

    def _take_ready(self, header: dict) -> None:
        if not header.get("ok"):
            self._kill()
            raise DraftProcessError(header.get("error", "the draft process failed to start"))
        self.info = header["info"]
        self._ready = True

    def close(self) -> None:
        with self._lock:
            self._off = True
            if self._conn is not None and self._proc is not None and self._proc.poll() is None:
                try:
                    _send(self._conn, {"op": "close"})
                    self._proc.wait(timeout=5)
                except Exception:
                    pass
            self._kill()

    def _kill(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc, self._conn, self._ready = None, None, False
        if conn is not None:
            conn.close()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    # -- the parent's side of the protocol --------------------------------------
    def _wait_reply(self, timeout: float, what: str) -> dict:
        """The child's next reply; DraftProcessError if it dies or does not answer in time."""
        deadline = time.monotonic() + timeout
        conn, proc = self._conn, self._proc
        if conn is None or proc is None:
            raise DraftProcessError("pearl: no draft process")
        while True:
            try:
                if conn.poll(min(POLL_S, max(0.0, deadline - time.monotonic()))):
                    return _recv(conn)
            except (EOFError, OSError) as e:
                raise DraftProcessError(f"pearl: the draft process closed its pipe during {what} ({e!r})") from e
            if proc.poll() is not None:
                raise DraftProcessError(f"pearl: the draft process exited with code {proc.returncode} during {what}")
            if time.monotonic() >= deadline:
                raise DraftProcessError(f"pearl: the draft process did not answer {what} within {timeout:.0f} s")

    def _failed(self, error: DraftProcessError) -> None:
        """Kill the child, log once, restart in the background (or stay off)."""
        self.deaths += 1
        for name, value in self._child_stats.items():
            if name not in GAUGES:
                self._dead_stats[name] = self._dead_stats.get(name, 0) + value
        self._child_stats = {}
        self._kill()
        if not self._logged:
            self._logged = True
            logger.error("freespec: %s; that step drafts nothing, restarting the draft process (logged once)", error)
        if self._off or self.restarts >= self.max_restarts:
            if not self._off:
                logger.error("freespec: pearl draft process failed %d times; pearl drafts nothing from now on",
                             self.deaths)
            self._off = True
            return
        self.restarts += 1
        try:
            self._launch()
        except Exception as e:
            self._off = True
            logger.error("freespec: pearl cannot restart its draft process (%s); pearl drafts nothing", e)

    def _usable(self) -> bool:
        """A ready child; a restarting one becomes ready here once its ready message has arrived."""
        if self._ready:
            return True
        if self._off or self._conn is None:
            return False
        try:
            if self._proc.poll() is not None:
                raise DraftProcessError(f"pearl: the restarted draft process exited with code {self._proc.returncode}")
            if not self._conn.poll(0):
                return False
            self._take_ready(_recv(self._conn))
            if "vocab_limit" in self.spec:
                _send(self._conn, {"op": "bind", "vocab_limit": self.spec["vocab_limit"]})
            return True
        except (DraftProcessError, EOFError, OSError) as e:
            self._failed(e if isinstance(e, DraftProcessError) else DraftProcessError(str(e)))
            return False

    # -- DraftWorker's interface --------------------------------------------------
    def bind(self, vocab_limit: int) -> None:
        with self._lock:
            self.spec["vocab_limit"] = int(vocab_limit)  # a restarted child gets it too
            if self._ready:
                _send(self._conn, {"op": "bind", "vocab_limit": int(vocab_limit)})

    def step(self, rows: Sequence[Row]) -> list[list[int]]:
        """The chains for this step; no chains (never a hang) while the child is dead or restarting."""
        with self._lock:
            if not self._usable():
                self.skipped_steps += 1
                return [[] for _ in rows]
            t0 = time.perf_counter()
            tokens = [np.ascontiguousarray(row.tokens, dtype=np.int32) for row in rows]
            header = {
                "op": "step",
                "keys": [int(row.key) for row in rows],
                "num_new": [int(row.num_new) for row in rows],
                "lengths": [len(t) for t in tokens],
            }
            try:
                _send(self._conn, header, b"".join(t.tobytes() for t in tokens))
                reply = self._wait_reply(self.step_timeout_s, "a step")
            except (DraftProcessError, OSError) as e:
                self._failed(e if isinstance(e, DraftProcessError) else DraftProcessError(f"pearl: {e!r}"))
                return [[] for _ in rows]
            finally:
                self.step_wait += time.perf_counter() - t0
            self._child_stats = reply.get("stats", self._child_stats)
            if not reply.get("ok"):
                raise RuntimeError(f"pearl draft process: {reply.get('error')}")
            return reply["chains"]

    def release(self, key: int) -> None:
        with self._lock:
            if self._ready:
                try:
                    _send(self._conn, {"op": "release", "key": int(key)})
                except OSError:
                    pass  # a dead child is noticed by the next step

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until the child's post-verify has nothing left to do (tests, measurements)."""
        with self._lock:
            if not self._ready:
                return False
            try:
                _send(self._conn, {"op": "wait_idle", "timeout": timeout})
                reply = self._wait_reply(timeout + 10, "wait_idle")
            except (DraftProcessError, OSError) as e:
                self._failed(e if isinstance(e, DraftProcessError) else DraftProcessError(f"pearl: {e!r}"))
                return False
            self._child_stats = reply.get("stats", self._child_stats)
            return bool(reply.get("idle"))

    def stats(self) -> dict:
        """The child's counters as of its last reply, and the parent's view of waiting and failures."""
        counters = {name: self._dead_stats.get(name, 0) + self._child_stats.get(name, 0)
                    for name in dict.fromkeys([*self._child_stats, *self._dead_stats]) if name not in GAUGES}
        return {
            **counters,
            **{name: self._child_stats[name] for name in GAUGES if name in self._child_stats},
            "step_wait": round(self.step_wait, 4),  # pipe included, as the target saw it
            "draft_step_wait": round(counters.get("step_wait", 0.0), 4),  # inside the child
            "deaths": self.deaths,
            "restarts": self.restarts,
            "skipped_steps": self.skipped_steps,
        }


def _close_ref(ref) -> None:
    obj = ref()
    if obj is not None:
        obj.close()


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
    try:
        worker, model = _build(spec)
    except Exception as e:
        _send(conn, {"ok": False, "error": f"{type(e).__name__}: {e}"})
        return
    _send(conn, {"ok": True, "info": {
        "pid": os.getpid(),
        "vocab_size": model.vocab_size,
        "max_position": model.max_position,
        "weight_bytes": model.weight_bytes(),
        "kv_bytes_per_token": model.kv_bytes_per_token(),
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }})

    def stats() -> dict:
        return {**worker.drafter.stats.as_dict(), **worker.times.as_dict(),
                "weight_bytes": model.weight_bytes(), "kv_bytes": model.kv_bytes(),
                "cached_requests": model.cached_requests(), "cached_tokens": model.cached_tokens()}

    try:
        while True:
            try:
                msg = _recv(conn)
            except EOFError:
                return  # the parent closed its end or died
            op = msg["op"]
            if op == "step":
                data = np.frombuffer(conn.recv_bytes(), dtype=np.int32)
                rows, at = [], 0
                for key, num_new, n in zip(msg["keys"], msg["num_new"], msg["lengths"]):
                    rows.append(Row(key, data[at : at + n], num_new))
                    at += n
                try:
                    reply = {"ok": True, "chains": [[int(t) for t in c] for c in worker.step(rows)]}
                except Exception as e:  # DraftWorker has reset the drafter; report and go on
                    reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
                reply["stats"] = stats()
                _send(conn, reply)
            elif op == "release":
                worker.release(msg["key"])
            elif op == "bind":
                model.vocab_limit = min(model.vocab_size, int(msg["vocab_limit"]))
            elif op == "wait_idle":
                _send(conn, {"ok": True, "idle": worker.wait_idle(float(msg["timeout"])), "stats": stats()})
            elif op == "close":
                return
    finally:
        worker.close()


def _build(spec: dict):
    import torch

    from freespec.proposers.pearl_draft import DraftWorker, TorchDraftModel
    from freespec.proposers.pearl_state import PearlDrafter

    torch.set_num_threads(int(spec.get("threads", 1)))
    model = TorchDraftModel.load(spec["model"], spec.get("device", "cpu"), spec.get("dtype", "float32"))
    if "vocab_limit" in spec:
        model.vocab_limit = min(model.vocab_size, int(spec["vocab_limit"]))
    drafter = PearlDrafter(model, int(spec["k"]), max_position=model.max_position, **spec["drafter"])
    # The whole process is already on the draft's cores: the worker thread needs no pinning of its own.
    worker = DraftWorker(drafter, cores=None, threads=int(spec.get("threads", 1)), device=spec.get("device", "cpu"))
    worker.start()
    return worker, model


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s pearl-draft[%(process)d] %(levelname)s %(message)s")
    _child_main(int(sys.argv[1]))
