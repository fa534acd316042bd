"""One background thread for a proposer's file work, so a step never waits for a disk or a network filesystem.

Used by ``recycle`` (its matrix) and the response store (the ``suffix`` source's past responses).

- ``request(snapshot, peers)``: write this snapshot (one slot: a newer snapshot replaces one not yet
  written) and read the peers' files (``read(peers)`` yields what is ready to merge).
- A peer's result waits in one slot until ``take()``; the thread waits for that, so at most one is held.
- ``write`` and ``read`` log their own failures; anything else they raise is logged here and the thread
  goes on (the next request tries again), so file trouble never stops the server.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

logger = logging.getLogger("freespec")


def error_kind(e: BaseException) -> str:
    """What makes a file failure the same as the last one, for logging it once: the errno of an ``OSError``
    (the same failure again names another temporary file), else the type and text."""
    if isinstance(e, OSError) and e.errno:
        return f"{type(e).__name__} {e.errno}"
    return f"{type(e).__name__}: {e}"


S = TypeVar("S")  # a snapshot to write
R = TypeVar("R")  # a peer's file, read and checked, ready to merge


class FileWorker(Generic[S, R]):
    def __init__(self, write: Callable[[S], None], read: Callable[[tuple[str, ...]], Iterable[R]], name: str) -> None:
        self._write, self._read, self.name = write, read, name
        self._cond = threading.Condition()
        self._snapshot: S | None = None
        self._peers: tuple[str, ...] = ()
        self._ready: R | None = None
        self._busy = self._stopping = False
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name=f"freespec-{name}", daemon=True)
        self._thread.start()

    def request(self, snapshot: S | None = None, peers: tuple[str, ...] = ()) -> None:
        with self._cond:
            if snapshot is not None:
                self._snapshot = snapshot  # coalesced: only the latest is written
            if peers:
                self._peers = tuple(dict.fromkeys(self._peers + tuple(peers)))
            self._cond.notify_all()

    def take(self) -> R | None:
        if self._ready is None:  # the common case, without the lock
            return None
        with self._cond:
            ready, self._ready = self._ready, None
            self._cond.notify_all()
            return ready

    def has_ready(self) -> bool:
        return self._ready is not None

    def wait(self, timeout: float) -> bool:
        """Until nothing is requested or running (True), a peer's result waits to be taken, or ``timeout`` (False)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._snapshot is not None or self._peers or self._busy:
                if self._ready is not None:
                    return False
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(left)
            return self._ready is None

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and self._snapshot is None and not self._peers:
                    self._cond.wait()
                if self._stopping:
                    return
                snapshot, self._snapshot = self._snapshot, None
                peers, self._peers = self._peers, ()
                self._busy = True
            try:
                if snapshot is not None:
                    self._write(snapshot)
                del snapshot
                if peers:
                    for ready in self._read(peers):
                        with self._cond:
                            while self._ready is not None and not self._stopping:
                                self._cond.wait()
                            if self._stopping:
                                return
                            self._ready = ready
                            self._cond.notify_all()
            except Exception:  # never let the thread die: the next request tries again
                self.errors += 1
                logger.exception("freespec: %s background file work failed; will try again", self.name)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
