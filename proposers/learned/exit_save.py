"""Run a proposer's final save at interpreter exit and on SIGTERM (persisted state must not be lost).

``save_at_exit(close, what)`` registers ``close`` with ``atexit`` (a strong reference: vLLM may drop its
drafter before the interpreter exits, and the last save must still happen) and, from the main thread
only (Python allows signal handlers nowhere else), chains a SIGTERM handler that calls it and then hands
the signal to the handler that was there before. ``close`` must be idempotent and must not raise.
``registered()`` names what this process saves at exit (the adapter warns when vLLM would not let it).

``between_saves()``: what another thread runs on a proposer's learned state (the adapter's idle saves,
``vllm_plugins.idle_save``) runs inside it, so that a final save never runs at the same time: the final save
waits for it (at most ``WAIT_S``), and once a final save has begun it yields False and the work is skipped.
"""
from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

logger = logging.getLogger("freespec")
_registered: list[str] = []
WAIT_S = 10.0  # the longest a final save waits for another thread's work on the state (never forever)
_lock = threading.RLock()  # re-entrant: a SIGTERM may arrive in the main thread while it holds it
_exiting = False


def registered() -> tuple[str, ...]:
    """What this process has asked to save at exit, in the order asked."""
    return tuple(_registered)


@contextmanager
def between_saves() -> Iterator[bool]:
    """Hold off the final save while the caller works on learned state; yields False once it has begun."""
    with _lock:
        yield not _exiting


def _final(close: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        global _exiting
        got = _lock.acquire(timeout=WAIT_S)
        try:
            _exiting = True
            close()
        finally:
            if got:
                _lock.release()
    return run


def save_at_exit(close: Callable[[], None], what: str) -> None:
    close = _final(close)
    atexit.register(close)
    _registered.append(what)
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except (ValueError, OSError):
        return

    def on_sigterm(signum, frame):
        try:
            close()
        except Exception:
            logger.exception("freespec: %s save on SIGTERM failed", what)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except (ValueError, OSError):
        pass
