"""Run a proposer's final save at interpreter exit and on SIGTERM (persisted state must not be lost).

``save_at_exit(close, what)`` registers ``close`` with ``atexit`` (a strong reference: vLLM may drop its
drafter before the interpreter exits, and the last save must still happen) and, from the main thread
only (Python allows signal handlers nowhere else), chains a SIGTERM handler that calls it and then hands
the signal to the handler that was there before. ``close`` must be idempotent and must not raise.
``registered()`` names what this process saves at exit (the adapter warns when vLLM would not let it).
"""
from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from typing import Callable

logger = logging.getLogger("freespec")
_registered: list[str] = []


def registered() -> tuple[str, ...]:
    """What this process has asked to save at exit, in the order asked."""
    return tuple(_registered)


def save_at_exit(close: Callable[[], None], what: str) -> None:
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
