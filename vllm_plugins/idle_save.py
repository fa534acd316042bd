"""Saves for an idle engine: what the last requests before a quiet spell taught reaches the disk.

A proposer's periodic saves run on engine steps, and vLLM tells a worker that a request finished only at the
next step. An engine with no more requests takes no step, so without this a server killed in a quiet spell
(a pod evicted at night, a crash) lost what its last requests taught, however long ago they finished.

``IdleSave`` runs one daemon thread per adapter, only for a plugin that saves learned state at exit (its
``bind`` registered a save with ``proposers.learned.exit_save``). Every ``IDLE_S`` without a step it calls the
proposer's ``idle()`` (``proposers.base.Proposer.idle``: keep the outputs of requests not yet released, save
when a save is due), holding the step lock so no step runs at the same time, and inside
``exit_save.between_saves`` so no final save does; at once again while it says more work waits (a replica's
responses, merged a step's worth a call), releasing the lock between calls so a step can come in. ``idle()``
does no file I/O (the proposers' file threads write), so the first step after a quiet spell waits at most for
an in-memory copy. A failing ``idle()`` is logged once and never stops the server.

Why not sooner than ``IDLE_S``: a gap between two steps is also a long step (a big prefill on a CPU), and
``idle()`` cuts what a live request has answered so far into its own stored response.

``warn_if_stop_skips_saves``: the one warning where vLLM's stop kills the worker before its exit save.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from freespec.proposers.learned import exit_save

logger = logging.getLogger("freespec")

IDLE_S = 5.0  # no step for this long: the engine is idle (checked again every IDLE_S while it stays idle)


class IdleSave:
    """``step()`` wraps each engine step; a thread calls ``idle()`` of the proposer when none came for ``idle_s``."""

    def __init__(self, proposer, idle_s: float = IDLE_S, name: str = "freespec-idle-save") -> None:
        self.proposer, self.idle_s = proposer, idle_s
        self._lock = threading.Lock()
        self._last_step = self._last_idle = time.monotonic()
        self._stop = threading.Event()
        self.calls = self.errors = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @contextmanager
    def step(self) -> Iterator[None]:
        with self._lock:
            try:
                yield
            finally:
                self._last_step = time.monotonic()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _quiet(self) -> bool:
        """No step, and no call of ``idle()``, for ``idle_s``."""
        return time.monotonic() - max(self._last_step, self._last_idle) >= self.idle_s

    def _run(self) -> None:
        while not self._stop.wait(self.idle_s / 4):
            # a step that ran lately or runs now (the lock taken): not idle
            while self._quiet() and self._lock.acquire(blocking=False):
                try:
                    more = self._quiet() and not self._stop.is_set() and self._idle()
                finally:
                    self._lock.release()  # between two calls a step may come in
                if not more:
                    self._last_idle = time.monotonic()
                    break

    def _idle(self) -> bool:
        """One call of the proposer's ``idle()``; True when it has more work waiting."""
        with exit_save.between_saves() as open_:
            if not open_:  # the final save has begun (or is done): nothing more to keep
                self._stop.set()
                return False
            self.calls += 1
            try:
                return bool(self.proposer.idle())
            except Exception:
                self.errors += 1
                if self.errors == 1:
                    logger.exception("freespec: the idle save failed; the next save tries again (logged once)")
                return False


def warn_if_stop_skips_saves(vllm_config) -> None:
    """One warning where this process saves learned state at exit and vLLM stops with ``--shutdown-timeout
    0`` (its default), which kills a served engine's worker at SIGTERM before that save (``freespec serve`` sets
    a timeout; see ``vllm_cli``)."""
    saving = exit_save.registered()
    if saving and getattr(vllm_config, "shutdown_timeout", None) == 0:
        logger.warning("freespec: %s saved at exit, but this vLLM stops with --shutdown-timeout 0, which kills a "
                       "served worker before it saves: what is learned since the last save (save_every_s) is lost "
                       "at each stop; serve with --shutdown-timeout 10 (freespec serve sets it)", " and ".join(saving))
