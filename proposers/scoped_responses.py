"""The ``suffix`` source's responses of tenants with a ``cache_salt``, kept per scope in a state directory.

``<state_dir>/suffix/<scope>/<writer>.bin``: one ``ResponseStore`` per scope, loaded at start with the scope's
peer files (other replicas', this writer's earlier incarnations'); all of them together hold at most
``max_responses`` responses and ``max_tokens`` tokens (the least recently used scope's oldest go first), and one
background thread saves those that changed. ``freespec state purge --scope SALT`` removes the scope's folder and
leaves a tombstone, ``<state_dir>/suffix/purged/<scope>``: each writer finds it at its next save, forgets the scope
(the source evicts its outputs) and removes its own file of it; at start a file older than its scope's tombstone is
not loaded. Tombstones go by age like every other file (``state_dir.sweep_old``).
"""
from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict

import numpy as np

from freespec.proposers import state_dir
from freespec.proposers.file_worker import FileWorker
from freespec.proposers.response_store import ResponseStore, ResponseStoreError

logger = logging.getLogger("freespec")

PURGED = "purged"  # the tombstones' folder under <state_dir>/suffix


def tombstone_dir(root: str) -> str:
    return os.path.join(root, PURGED)


def purge_scope(root: str, scope: str) -> list[str]:
    """Remove every file of ``scope`` under ``root`` (``<state_dir>/suffix``) and leave its tombstone; the paths
    removed."""
    folder = os.path.join(root, scope)
    gone = []
    if os.path.isdir(folder) and not os.path.islink(folder):
        for name in os.listdir(folder):
            try:
                os.unlink(os.path.join(folder, name))
                gone.append(os.path.join(folder, name))
            except FileNotFoundError:
                pass
        try:
            os.rmdir(folder)
        except OSError:
            pass
    os.makedirs(tombstone_dir(root), mode=0o700, exist_ok=True)
    mark = os.path.join(tombstone_dir(root), scope)
    fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    os.close(fd)
    os.utime(mark)
    return gone


def _tombstones(root: str) -> dict[str, float]:
    try:
        with os.scandir(tombstone_dir(root)) as entries:
            return {e.name: e.stat(follow_symlinks=False).st_mtime for e in entries}
    except OSError:
        return {}


class ScopedResponses:
    """Per-scope response stores of one writer (see the module docstring)."""

    def __init__(self, root: str, *, fingerprint: str, vocab_size: int, max_responses: int, max_tokens: int,
                 max_age_s: float) -> None:
        self.root, self.fingerprint, self.vocab_size = root, fingerprint, vocab_size
        self.max_responses, self.max_tokens, self.max_age_s = max_responses, max_tokens, max_age_s
        self.stores: OrderedDict[str, ResponseStore] = OrderedDict()  # least recently used first
        self._dirty: set[str] = set()
        self._unsaved: dict = {}  # store -> True, handed to the background thread and not yet written
        self._unsaved_lock = threading.Lock()
        self._seen_tombstones: dict[str, float] = {}
        self._files: FileWorker | None = None

    def _store(self, scope: str) -> ResponseStore:
        store = self.stores.get(scope)
        if store is None:
            path = os.path.join(state_dir.source_dir(self.root, scope), f"{state_dir.writer_id()}.bin")
            store = self.stores[scope] = ResponseStore(
                path, fingerprint=self.fingerprint, vocab_size=self.vocab_size, max_responses=self.max_responses,
                max_tokens=self.max_tokens, perms=state_dir.FILE_MODE)
        self.stores.move_to_end(scope)
        return store

    def load(self) -> dict[str, list[np.ndarray]]:
        """At start: every scope folder's files (this writer's and its peers'), newer than the bound and than
        the scope's tombstone; a bad file is skipped. The responses loaded, by scope."""
        self._seen_tombstones = _tombstones(self.root)
        loaded: dict[str, list[np.ndarray]] = {}
        try:
            names = sorted(os.listdir(self.root))
        except OSError:
            return loaded
        for scope in names:
            folder = os.path.join(self.root, scope)
            if len(scope) != 32 or not os.path.isdir(folder) or os.path.islink(folder):
                continue
            state_dir.sweep_old(folder, self.max_age_s)
            since = self._seen_tombstones.get(scope, 0.0)
            store = self._store(scope)
            for path in [store.path, *state_dir.peer_files(store.path, self.max_age_s)]:
                try:
                    if os.path.getmtime(path) <= since:
                        continue
                    loaded.setdefault(scope, []).extend(store.merge_from(path))
                except (OSError, ResponseStoreError) as e:
                    logger.warning("freespec: suffix state_dir: %s skipped (%s)", path, e)
            self._bound()
        return loaded

    def add(self, scope: str, tokens: np.ndarray) -> None:
        if self._store(scope).add(tokens):
            self._dirty.add(scope)
            self._bound()

    def _bound(self) -> None:
        """All stores together within the bounds: the least recently used scope's oldest responses go first."""
        count = sum(len(s) for s in self.stores.values())
        tokens = sum(s.num_tokens for s in self.stores.values())
        for scope in list(self.stores):
            store = self.stores[scope]
            while (count > self.max_responses or tokens > self.max_tokens) and len(store):
                tokens -= store.evict_oldest()
                count -= 1
                self._dirty.add(scope)
            if count <= self.max_responses and tokens <= self.max_tokens:
                return

    def tick(self) -> list[str]:
        """Every save interval (no file I/O here): hand the changed stores to the background thread and ask it
        for new tombstones; returns the scopes a tombstone found since the last tick (now forgotten here)."""
        if self._files is None:
            self._files = FileWorker(self._write, self._scan, "suffix-scopes")
        purged, work = [], []
        found = self._files.take()
        if found is not None:
            for scope in found:
                purged.append(scope)
                if scope in self.stores:
                    self._dirty.discard(scope)
                    store = self.stores.pop(scope)
                    with self._unsaved_lock:
                        self._unsaved.pop(store, None)
                    work.append(("unlink", store.path))
        with self._unsaved_lock:  # a request replaces one not yet run: it carries every store not yet written
            for scope in self._dirty:
                self._unsaved[self.stores[scope]] = True
            work += [("save", store) for store in self._unsaved]
        self._dirty.clear()
        self._files.request(work or None, peers=(PURGED,))
        return purged

    def _write(self, batch) -> None:
        for what, target in batch:
            if what == "save":
                with self._unsaved_lock:
                    self._unsaved.pop(target, None)
                target._save(target._snapshot())
            else:
                try:
                    os.unlink(target)
                except OSError:
                    pass

    def _scan(self, _peers):
        marks = _tombstones(self.root)
        new = [s for s, t in marks.items() if self._seen_tombstones.get(s) != t]
        self._seen_tombstones.update(marks)
        if new:
            yield new

    def close(self) -> None:
        """The final save of every changed store, in this thread (at exit; never raises)."""
        if self._files is not None:
            self._files.stop()
        for store in list(self.stores.values()):
            store.close()
