"""The pearl draft outside vLLM's worker: what a child process and a Ray actor share.

Two placements run the draft model away from vLLM's worker: ``"process"``
(a child over a socket pair, ``pearl.process``) and ``"ray"`` (a Ray actor,
``ray``). They differ only in how a message travels; this module holds
everything else, once:

- ``DraftServer``, the draft's side: builds the ``DraftWorker`` from a plain
  spec and answers the messages (``step``, ``release``, ``bind``,
  ``wait_idle``). The pipe child's loop and the Ray actor both just hand it
  what they received.
- ``RemoteDraft``, the worker's side: the ``DraftWorker`` interface plus the
  failure rules. A draft that dies or does not answer a step in
  ``step_timeout_s`` is killed; that step drafts nothing; the error is logged
  once; a new one is started in the background. After ``max_restarts``
  failures in a row pearl drafts nothing for a back-off period (``RESTART_BACKOFF_S``:
  5 s, doubling up to 300 s) and then starts a draft again, so it is never off
  for good; a draft that has answered steps for ``HEALTHY_S`` clears the count
  and the back-off. After a step timed out, later steps wait at most
  ``RETRY_TIMEOUT_S`` (2 s) until the draft has been healthy for ``HEALTHY_S``, so
  a draft that keeps hanging cannot block a step for ``step_timeout_s`` more than
  once. Until a draft is ready, steps draft nothing without waiting; counters of
  dead drafts are kept. Subclasses supply the transport
  (``_launch``, ``_poll_ready``, ``_call``, ``_tell``, ``_goodbye``, ``_kill``).

Messages are plain: a JSON-able header (numbers, lists, strings) and, for a
step, the rows' token ids as raw int32 bytes. Nothing freespec receives is
unpickled.
"""
from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import time
import weakref
from typing import Optional, Sequence

import numpy as np

from freespec import settings
from freespec.proposers.api import Row

logger = logging.getLogger("freespec")

START_TIMEOUT_S = settings.pearl_start_timeout_s()  # import torch + load weights (read at import)
GAUGES = ("weight_bytes", "kv_bytes", "cached_requests", "cached_tokens")  # in stats: now, not summed


# A restarted draft that fails again waits before the next start: 5 s, doubling up to 300 s.
RESTART_BACKOFF_S = (5.0, 300.0)
HEALTHY_S = 60.0  # a draft answering steps this long clears the failure count, the back-off and the short timeout
RETRY_TIMEOUT_S = 2.0  # a step's timeout after a step timed out, until the draft is healthy again
# Meanwhile a row further behind than this is caught up in the background, not in the step: a draft restarted
# after a timeout holds no request, and re-reading every live context inside RETRY_TIMEOUT_S cannot succeed
# (the step timed out, the draft was restarted again, and so on while those requests lived).
RETRY_SYNC_FEED_TOKENS = 16


class DraftError(RuntimeError):
    """The remote draft died, did not answer in time, or could not start."""


class DraftTimeout(DraftError):
    """The remote draft did not answer a message in time."""


# --------------------------------------------------------------------------- messages


def encode_step(rows: Sequence[Row], token_cost: Optional[float] = None,
                sync_feed_tokens: Optional[int] = None) -> tuple[dict, bytes]:
    tokens = [np.ascontiguousarray(row.tokens, dtype=np.int32) for row in rows]
    header = {
        "op": "step",
        "keys": [int(row.key) for row in rows],
        "num_new": [int(row.num_new) for row in rows],
        "lengths": [len(t) for t in tokens],
        "token_cost": token_cost,
        "sync_feed_tokens": sync_feed_tokens,
    }
    return header, b"".join(t.tobytes() for t in tokens)


def decode_step(header: dict, payload: bytes) -> list[Row]:
    data = np.frombuffer(payload, dtype=np.int32)
    rows, at = [], 0
    for key, num_new, n in zip(header["keys"], header["num_new"], header["lengths"]):
        rows.append(Row(key, data[at : at + n], num_new))
        at += n
    return rows


# --------------------------------------------------------------------------- the draft's side


class DraftServer:
    """Builds the draft from a spec and answers messages; the same in the pipe child and the Ray actor."""

    def __init__(self) -> None:
        self.worker = None
        self.model = None

    def start(self, spec: dict, **extra_info) -> dict:
        """Load the model and start the draft thread: the ready reply, or an error reply."""
        try:
            self.worker, self.model = build(spec)
        except Exception as e:
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}
        model = self.model
        return {"ok": True, "info": {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "vocab_size": model.vocab_size,
            "max_position": model.max_position,
            "weight_bytes": model.weight_bytes(),
            "kv_bytes_per_token": model.kv_bytes_per_token(),
            "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            **extra_info,
        }}

    def stats(self) -> dict:
        worker, model = self.worker, self.model
        return {**worker.drafter.stats.as_dict(), **worker.times.as_dict(),
                "weight_bytes": model.weight_bytes(), "kv_bytes": model.kv_bytes(),
                "cached_requests": model.cached_requests(), "cached_tokens": model.cached_tokens()}

    def handle(self, msg: dict, payload: Optional[bytes] = None) -> Optional[dict]:
        """The reply to one message (None for those that get none: ``release``, ``bind``)."""
        op = msg["op"]
        if op == "step":
            try:
                chains = self.worker.step(decode_step(msg, payload), msg.get("token_cost"),
                                          sync_feed_tokens=msg.get("sync_feed_tokens"))
                reply = {"ok": True, "chains": [[int(t) for t in c] for c in chains]}
            except Exception as e:  # DraftWorker has reset the drafter; report and go on
                reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            reply["stats"] = self.stats()
            return reply
        if op == "release":
            self.worker.release(msg["key"])
        elif op == "bind":
            self.model.vocab_limit = min(self.model.vocab_size, int(msg["vocab_limit"]))
        elif op == "wait_idle":
            return {"ok": True, "idle": self.worker.wait_idle(float(msg["timeout"])), "stats": self.stats()}
        else:
            return {"ok": False, "error": f"unknown op {op!r}"}
        return None

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()


def build(spec: dict):
    """The ``DraftWorker`` (started) and its model, from a plain spec: model path, drafter options, threads, device."""
    import torch

    from freespec.proposers.pearl.draft import DraftWorker, TorchDraftModel
    from freespec.proposers.pearl.state import PearlDrafter

    torch.set_num_threads(int(spec.get("threads", 1)))
    model = TorchDraftModel.load(spec["model"], spec.get("device", "cpu"), spec.get("dtype", "float32"))
    if "vocab_limit" in spec:
        model.vocab_limit = min(model.vocab_size, int(spec["vocab_limit"]))
    drafter = PearlDrafter(model, int(spec["k"]), max_position=model.max_position, **spec["drafter"])
    # The whole process is the draft's (pinned by the pipe child, placed by Ray): the thread needs no pinning.
    worker = DraftWorker(drafter, cores=None, threads=int(spec.get("threads", 1)), device=spec.get("device", "cpu"))
    worker.start()
    return worker, model


# --------------------------------------------------------------------------- the worker's side


class RemoteDraft:
    """vLLM's side of a draft that runs elsewhere; see the module docstring. Subclasses carry the messages."""

    kind = "draft"  # in messages: "draft process", "draft actor"

    def __init__(self, spec: dict, *, step_timeout_s: float = 30.0, max_restarts: int = 3) -> None:
        self.spec = dict(spec)  # plain JSON: model path, drafter options, threads, device (, cores)
        self.step_timeout_s = step_timeout_s
        self.max_restarts = max_restarts
        self.info: dict = {}  # what the draft reported when ready (pid, vocab_size, weight_bytes, ...)
        self.step_wait = 0.0  # seconds step() blocked, transport included: the target waited for drafts
        self.restarts = 0
        self.deaths = 0
        self.skipped_steps = 0  # steps with no draft ready: nothing drafted, nothing waited for
        self._remote_stats: dict = {}  # the current draft's counters, as of its last reply
        self._dead_stats: dict = {}  # counters of drafts that died, so stats() stays cumulative
        self._ready = False
        self._off = False  # closed: never started again
        self._logged = False
        self.failures_in_a_row = 0
        self.backoffs = 0  # times the draft was left off for a back-off period
        self._backoff_s = RESTART_BACKOFF_S[0]
        self._relaunch_at: Optional[float] = None  # when a draft left off after failures is started again
        self._good_since: Optional[float] = None  # first good step since the last failure
        self._short_timeout = False  # a step timed out: wait at most RETRY_TIMEOUT_S until healthy again
        self._lock = threading.Lock()  # step/wait_idle/close may come from different threads
        atexit.register(_close_ref, weakref.ref(self))

    # -- the transport, per subclass ----------------------------------------------
    def _launch(self) -> None:
        """Start a new draft and send it the spec; do not wait for it."""
        raise NotImplementedError

    def _launched(self) -> bool:
        """A draft is running (ready or loading)."""
        raise NotImplementedError

    def _poll_ready(self, timeout: float) -> Optional[dict]:
        """The draft's ready reply if it comes within ``timeout`` (0: only look), else None; DraftError if it died."""
        raise NotImplementedError

    def _call(self, msg: dict, payload: Optional[bytes], timeout: float, what: str) -> dict:
        """Send a message and return its reply; DraftError if the draft dies or does not answer within ``timeout``."""
        raise NotImplementedError

    def _tell(self, msg: dict) -> None:
        """Send a message that gets no reply; DraftError if it cannot be sent."""
        raise NotImplementedError

    def _goodbye(self) -> None:
        """Ask a live draft to stop cleanly (bounded; errors ignored) before ``_kill``."""

    def _kill(self) -> None:
        """End the draft now, whatever state it is in."""
        raise NotImplementedError

    # -- life cycle -------------------------------------------------------------
    def start(self) -> None:
        """Start the draft and wait until its model is loaded; raise with the draft's error if it cannot."""
        self._launch()
        try:
            header = self._poll_ready(START_TIMEOUT_S)
            if header is None:
                raise DraftError(f"pearl: the {self.kind} did not load the model within {START_TIMEOUT_S:.0f} s "
                                 "(FREESPEC_PEARL_START_TIMEOUT_S)")
            self._take_ready(header)
        except BaseException:
            self._kill()
            raise

    def _take_ready(self, header: dict) -> None:
        if not header.get("ok"):
            self._kill()
            raise DraftError(header.get("error", f"the {self.kind} failed to start"))
        self.info = header["info"]
        self._ready = True

    def close(self) -> None:
        with self._lock:
            self._off = True
            if self._launched():
                try:
                    self._goodbye()
                except Exception:
                    pass
            self._kill()
            self._ready = False

    def _failed(self, error: DraftError) -> None:
        """Kill the draft, log once, restart it in the background (or after a back-off period)."""
        self.deaths += 1
        for name, value in self._remote_stats.items():
            if name not in GAUGES:
                self._dead_stats[name] = self._dead_stats.get(name, 0) + value
        self._remote_stats = {}
        self._ready = False
        self._kill()
        if isinstance(error, DraftTimeout) or "did not answer" in str(error):
            self._short_timeout = True
        if not self._logged:
            self._logged = True
            logger.error("freespec: %s; that step drafts nothing, restarting the %s (logged once)", error, self.kind)
        if self._off:
            return
        self.failures_in_a_row += 1
        self._good_since = None
        if self.failures_in_a_row > self.max_restarts:
            self._back_off(f"failed {self.failures_in_a_row} times in a row (the last: {error})")
            return
        self._relaunch()

    def _back_off(self, why: str) -> None:
        self.backoffs += 1
        self._relaunch_at = time.monotonic() + self._backoff_s
        logger.error("freespec: pearl %s %s; pearl drafts nothing for %.0f s, then starts it again",
                     self.kind, why, self._backoff_s)
        self._backoff_s = min(2 * self._backoff_s, RESTART_BACKOFF_S[1])

    def _relaunch(self) -> None:
        self.restarts += 1
        try:
            self._launch()
        except Exception as e:
            self._kill()
            self._back_off(f"cannot be restarted ({e})")

    def _usable(self) -> bool:
        """A ready draft; a restarting one becomes ready here once its ready reply has arrived."""
        if self._ready:
            return True
        if self._off:
            return False
        if not self._launched():
            if self._relaunch_at is not None and time.monotonic() >= self._relaunch_at:
                self._relaunch_at = None
                self._relaunch()  # ready at a later step; this one does not wait for the model to load
            return False
        try:
            header = self._poll_ready(0)
            if header is None:
                return False
            self._take_ready(header)
            if "vocab_limit" in self.spec:
                self._tell({"op": "bind", "vocab_limit": self.spec["vocab_limit"]})
            return True
        except DraftError as e:
            self._failed(e)
            return False

    def _step_timeout(self) -> float:
        return min(self.step_timeout_s, RETRY_TIMEOUT_S) if self._short_timeout else self.step_timeout_s

    def _answered(self) -> None:
        """A step came back: after ``HEALTHY_S`` of them the failure count, back-off and short timeout are cleared."""
        now = time.monotonic()
        if self._good_since is None:
            self._good_since = now
        elif now - self._good_since >= HEALTHY_S and (self.failures_in_a_row or self._short_timeout
                                                        or self._backoff_s != RESTART_BACKOFF_S[0]):
            self.failures_in_a_row = 0
            self._short_timeout = False
            self._backoff_s = RESTART_BACKOFF_S[0]

    # -- DraftWorker's interface --------------------------------------------------
    def bind(self, vocab_limit: int) -> None:
        with self._lock:
            self.spec["vocab_limit"] = int(vocab_limit)  # a restarted draft gets it too
            if self._ready:
                try:
                    self._tell({"op": "bind", "vocab_limit": int(vocab_limit)})
                except DraftError:
                    pass  # a dead draft is noticed by the next step; its successor reads the spec

    def step(self, rows: Sequence[Row], token_cost: Optional[float] = None) -> list[list[int]]:
        """The chains for this step; no chains (never a hang) while the draft is dead or restarting."""
        with self._lock:
            if not self._usable():
                self.skipped_steps += 1
                return [[] for _ in rows]
            t0 = time.perf_counter()
            catch_up = RETRY_SYNC_FEED_TOKENS if self._short_timeout else None
            header, payload = encode_step(rows, token_cost, catch_up)
            try:
                reply = self._call(header, payload, self._step_timeout(), "a step")
            except DraftError as e:
                self._failed(e)
                return [[] for _ in rows]
            finally:
                self.step_wait += time.perf_counter() - t0
            self._answered()
            self._remote_stats = reply.get("stats", self._remote_stats)
            if not reply.get("ok"):
                raise RuntimeError(f"pearl {self.kind}: {reply.get('error')}")
            return reply["chains"]

    def release(self, key: int) -> None:
        with self._lock:
            if self._ready:
                try:
                    self._tell({"op": "release", "key": int(key)})
                except DraftError:
                    pass  # a dead draft is noticed by the next step

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until the draft's post-verify has nothing left to do (tests, measurements)."""
        with self._lock:
            if not self._ready:
                return False
            try:
                reply = self._call({"op": "wait_idle", "timeout": timeout}, None, timeout + 10, "wait_idle")
            except DraftError as e:
                self._failed(e)
                return False
            self._remote_stats = reply.get("stats", self._remote_stats)
            return bool(reply.get("idle"))

    def stats(self) -> dict:
        """The draft's counters as of its last reply, and this side's view of waiting and failures."""
        live, dead = self._remote_stats, self._dead_stats
        counters = {name: dead.get(name, 0) + live.get(name, 0)
                    for name in dict.fromkeys([*live, *dead]) if name not in GAUGES}
        return {
            **counters,
            **{name: live[name] for name in GAUGES if name in live},
            "step_wait": round(self.step_wait, 4),  # transport included, as the target saw it
            "draft_step_wait": round(counters.get("step_wait", 0.0), 4),  # inside the draft
            "deaths": self.deaths,
            "restarts": self.restarts,
            "backoffs": self.backoffs,
            "skipped_steps": self.skipped_steps,
        }


def _close_ref(ref) -> None:
    obj = ref()
    if obj is not None:
        obj.close()
