"""The ``suffix`` source's responses of tenants with a ``cache_salt``, kept per scope in a state directory.

``<state_dir>/suffix/<scope>/<writer>.bin``: one ``ResponseStore`` per scope, loaded at start with the scope's
peer files (other replicas', this writer's earlier incarnations'); all of them together hold at most
``max_responses`` responses and ``max_tokens`` tokens (the least recently used scope's oldest go first). One
background thread saves those that changed and, every save interval, reads the peers' changed files of every
scope folder (at most ``MERGE_FILES`` a time) and prepares their merges; the engine's thread only applies them. ``freespec state purge --scope SALT`` removes the scope's folder and
leaves a tombstone, ``<state_dir>/suffix/purged/<scope>``: each writer finds it at its next save, forgets the scope
(the source evicts its outputs) and removes its own file of it; at start a file older than its scope's tombstone is
not loaded. Tombstones go by age like every other file (``state_dir.sweep_old``).

Disk: this writer's files of all scopes together stay within ``max_bytes`` (option ``state_max_mb``): the
responses' bounds above do not bound how many scopes there are, and each scope's file costs its header however
little it holds. A save that would go beyond removes the least recently used scopes' files and this writer's
stores of them (the source's trees keep what they hold), the scope just used too if it alone is larger. Only
this writer's own files are counted and removed: a peer's go by age. A scope whose every response the
responses' bounds evicted has no file of this writer's (it is removed at the next save).
"""
from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict

import numpy as np

from freespec.proposers import state_dir
from freespec.proposers.file_worker import FileWorker
from freespec.proposers.response_store import ResponseStore, ResponseStoreError, file_bytes

logger = logging.getLogger("freespec")

PURGED = state_dir.TOMBSTONES  # the tombstones' folder under <state_dir>/suffix
MERGE_FILES = 64  # peers' files read per save interval, all scopes together


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


def _scope_of(path: str) -> str:
    """The scope of a file ``<root>/<scope>/<writer>.bin``."""
    return os.path.basename(os.path.dirname(path))


def _tombstones(root: str) -> dict[str, float]:
    try:
        with os.scandir(tombstone_dir(root)) as entries:
            return {e.name: e.stat(follow_symlinks=False).st_mtime for e in entries}
    except OSError:
        return {}


class ScopedResponses:
    """Per-scope response stores of one writer (see the module docstring)."""

    def __init__(self, root: str, *, fingerprint: str, vocab_size: int, max_responses: int, max_tokens: int,
                 max_age_s: float, max_bytes: int) -> None:
        self.root, self.fingerprint, self.vocab_size = root, fingerprint, vocab_size
        self.max_responses, self.max_tokens, self.max_age_s = max_responses, max_tokens, max_age_s
        self.max_bytes = max_bytes
        self.writer = state_dir.writer_id()
        self.stores: OrderedDict[str, ResponseStore] = OrderedDict()  # least recently used first
        self._dirty: set[str] = set()
        self._unsaved: dict = {}  # store -> True, handed to the background thread and not yet written
        self._unsaved_lock = threading.Lock()
        self._seen_tombstones: dict[str, float] = {}
        self._files: FileWorker | None = None
        self._stores_lock = threading.Lock()  # self.stores: the engine's thread and the background one
        self._peer_seen: dict = {}  # the background thread's: peer path -> (mtime_ns, size) last merged
        self._peer_errors: dict = {}
        self._on_disk: dict[str, int] = {}  # scope -> bytes of this writer's file of it (the writing thread's)
        self._dropped: set[str] = set()  # scopes whose file the byte bound removed (logged once each)

    def _store(self, scope: str, touch: bool = True) -> ResponseStore:
        """The scope's store, made if missing (no file I/O: its folder is made when it is first saved)."""
        with self._stores_lock:
            store = self.stores.get(scope)
            if store is None:
                path = os.path.join(self.root, scope, f"{self.writer}.bin")
                store = self.stores[scope] = ResponseStore(
                    path, fingerprint=self.fingerprint, vocab_size=self.vocab_size, max_responses=self.max_responses,
                    max_tokens=self.max_tokens, perms=state_dir.FILE_MODE, check_folder=False)
                if not touch:
                    self.stores.move_to_end(scope, last=False)
            if touch:
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
            try:
                self._on_disk[scope] = os.lstat(store.path).st_size  # an earlier incarnation's, taken back
            except OSError:
                pass
            for path in [store.path, *state_dir.peer_files(store.path, self.max_age_s)]:
                try:
                    st = os.stat(path)
                    if st.st_mtime <= since:
                        continue
                    loaded.setdefault(scope, []).extend(store.merge_from(path))
                    self._peer_seen[path] = (st.st_mtime_ns, st.st_size)
                except FileNotFoundError:
                    continue
                except (OSError, ResponseStoreError) as e:
                    logger.warning("freespec: suffix state_dir: %s skipped (%s)", path, e)
            self._bound()
        self._hold_bytes({})  # this writer's earlier incarnation's files, written under a larger bound
        return loaded

    def add(self, scope: str, tokens: np.ndarray) -> None:
        if self._store(scope).add(tokens):
            self._dirty.add(scope)
            self._bound()

    def _bound(self) -> None:
        """All stores together within the bounds: the least recently used scope's oldest responses go first."""
        with self._stores_lock:  # a copy: the writing thread may drop a scope (``_hold_bytes``)
            stores = list(self.stores.items())
        count = sum(len(store) for _, store in stores)
        tokens = sum(store.num_tokens for _, store in stores)
        for scope, store in stores:
            while (count > self.max_responses or tokens > self.max_tokens) and len(store):
                tokens -= store.evict_oldest()
                count -= 1
                self._dirty.add(scope)
            if count <= self.max_responses and tokens <= self.max_tokens:
                return

    def tick(self) -> tuple[list[str], list[tuple[str, np.ndarray]]]:
        """Every save interval (no file I/O here): apply the peers' merges the background thread prepared, hand
        it the changed stores and ask for new tombstones and peers' files. Returns the scopes a tombstone
        removed since the last tick (forgotten here) and the (scope, response) pairs the merges added."""
        if self._files is None:
            self._files = FileWorker(self._write, self._scan, "suffix-scopes")
        purged, work, added = [], [], []
        found = self._files.take()
        tombstoned, merges = found if found is not None else ((), ())
        for scope, store, prepared in merges:
            if self.stores.get(scope) is store:
                added += [(scope, r) for r in store._apply(prepared)]
                self._bound()
        if tombstoned:
            for scope in tombstoned:
                purged.append(scope)
                added = [(s, r) for s, r in added if s != scope]
                with self._stores_lock:
                    store = self.stores.pop(scope, None)
                if store is not None:
                    self._dirty.discard(scope)
                    with self._unsaved_lock:
                        self._unsaved.pop(store, None)
                    work.append(("unlink", store.path))
        with self._unsaved_lock:  # a request replaces one not yet run: it carries every store not yet written
            for scope in self._dirty:
                store = self.stores.get(scope)
                if store is not None:  # else the byte bound dropped it since
                    self._unsaved[store] = True
            work += [("save", store) for store in self._unsaved]
        self._dirty.clear()
        self._files.request(work or None, peers=(PURGED,))
        return purged, added

    def _write(self, batch) -> None:
        planned = {}
        for what, target in batch:
            if what == "save":
                with self._unsaved_lock:
                    self._unsaved.pop(target, None)
                stored = target._snapshot()
                if stored.entries:
                    planned[target] = stored
                    continue
                if not self._emptied(target):
                    continue
                target = target.path
            try:
                os.unlink(target)
            except OSError:
                pass
            self._on_disk.pop(_scope_of(target), None)
        for store, stored in self._hold_bytes(planned).items():
            try:
                state_dir.source_dir(self.root, _scope_of(store.path))
            except OSError:
                pass  # the save below says why it cannot write
            self._save(store, stored)

    def _emptied(self, store: ResponseStore) -> bool:
        """Whether ``store``, holding no responses, is its scope's live store, so that its file is removed rather
        than saved: ``_bound`` may evict a scope's every response, and a file saying only what it evicted
        would erase the peers' (``read_store`` refuses it). A store forgotten since (dropped, purged) may share
        its path with the scope's new one, whose file stays."""
        with self._stores_lock:
            return self.stores.get(_scope_of(store.path)) is store

    def _save(self, store: ResponseStore, stored, **final) -> None:
        before = store.saves
        store._save(stored, **final)
        if store.saves > before:  # a failed save leaves the old file, and its size, as they were
            self._on_disk[_scope_of(store.path)] = self._bytes(stored)

    def _bytes(self, stored) -> int:
        return file_bytes(len(stored.entries), sum(len(e.tokens) for e in stored.entries), self.fingerprint)

    def _hold_bytes(self, planned: dict) -> dict:
        """Of the saves ``planned`` (store -> its snapshot), those that keep this writer's files of all scopes
        within ``max_bytes``: while they would not, the least recently used scope's file is removed and its
        store forgotten, so no later save writes it again (an add to the scope makes a new one). In the
        writing thread; never a peer's file."""
        with self._stores_lock:
            order = list(self.stores.items())  # least recently used first
        live = {store for _, store in order}
        # a store forgotten since its save was asked for (dropped, purged) is not written again
        planned = {store: stored for store, stored in planned.items() if store in live}
        size = {scope: self._bytes(planned[store]) if store in planned else self._on_disk.get(scope, 0)
                for scope, store in order}
        total = sum(size.values()) + sum(b for s, b in self._on_disk.items() if s not in size)
        for scope, store in order:
            if total <= self.max_bytes:
                break
            if not size[scope]:
                continue  # neither a file nor a save of this writer's: forgetting it frees nothing
            if scope in self._on_disk:
                try:
                    os.unlink(store.path)
                except FileNotFoundError:
                    pass
                except OSError as e:
                    logger.warning("freespec: suffix state_dir: %s not removed (%s)", store.path, e)
                    continue
                del self._on_disk[scope]
            total -= size[scope]
            with self._stores_lock:
                if self.stores.get(scope) is store:
                    del self.stores[scope]
            planned.pop(store, None)
            with self._unsaved_lock:
                self._unsaved.pop(store, None)
            if scope not in self._dropped:
                self._dropped.add(scope)
                logger.info("freespec: suffix state_dir: scope %s's file removed: this writer's files of all "
                            "scopes would exceed state_max_mb (%g MB); least recently used first (logged once "
                            "per scope)", scope, self.max_bytes / 1e6)
        return planned

    def _scan(self, _peers):
        """In the background: new tombstones, and the merges of peers' files that changed (``tick`` applies
        them), as one result."""
        marks = _tombstones(self.root)
        new = [s for s, t in marks.items() if self._seen_tombstones.get(s) != t]
        self._seen_tombstones.update(marks)
        merges = []
        try:
            names = sorted(os.listdir(self.root))
        except OSError:
            names = []
        for scope in names:
            if len(merges) >= MERGE_FILES:
                break
            if len(scope) != 32 or scope in new or not os.path.isdir(os.path.join(self.root, scope)):
                continue
            own = os.path.join(self.root, scope, f"{self.writer}.bin")
            since = marks.get(scope, 0.0)
            for path in state_dir.peer_files(own, self.max_age_s):
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if st.st_mtime <= since or self._peer_seen.get(path) == (st.st_mtime_ns, st.st_size):
                    continue  # unchanged: no store made for it (nor brought back after the byte bound dropped it)
                store = self._store(scope, touch=False)
                prepared = store._read_peer(path, self._peer_seen, self._peer_errors)
                if prepared is not None:
                    merges.append((scope, store, prepared))
                if len(merges) >= MERGE_FILES:
                    break
        if new or merges:
            yield new, merges

    def close(self) -> None:
        """The final save of every changed store, in this thread (at exit; never raises)."""
        if self._files is not None:
            self._files.stop()
        with self._stores_lock:
            stores = list(self.stores.values())
        planned = {}
        for store in stores:
            if store._closed:
                continue
            store._closed = True
            stored = store._snapshot()
            if stored.entries:
                planned[store] = stored
            elif _scope_of(store.path) in self._on_disk and self._emptied(store):  # see ``_emptied``
                try:
                    os.unlink(store.path)
                except OSError:
                    pass
                self._on_disk.pop(_scope_of(store.path), None)
        for store, stored in self._hold_bytes(planned).items():
            try:
                os.makedirs(os.path.dirname(store.path), mode=0o700, exist_ok=True)
            except OSError:
                pass  # its save says why it cannot write
            self._save(store, stored, timeout=10.0, final=True)
