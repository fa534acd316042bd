"""The ``suffix`` source's responses of tenants with a ``cache_salt``, kept per scope in a state directory.

``<state_dir>/suffix/<scope>/<writer>.bin``: one ``ResponseStore`` per scope, loaded at start with the scope's
peer files (other replicas', this writer's earlier incarnations'); all of them together hold at most
``max_responses`` responses and ``max_tokens`` tokens (the least recently used scope's oldest go first). One
background thread saves those that changed and, every save interval, reads the peers' changed files of every
scope folder (at most ``MERGE_FILES`` a time) and prepares their merges; the engine's thread only applies them. ``freespec state purge --scope SALT`` removes the scope's files and leaves a tombstone,
``<state_dir>/suffix/purged/<scope>``, holding a new random purge generation. A scope's files are written for
the generation their writer knew (in the store's fingerprint, ``fingerprint_for``): once a tombstone names a
new one, a file of an older generation is purged text whoever wrote it and whenever: never loaded or merged,
and removed by whichever process sees it. Each writer reads the tombstones before every save (its own file of
an old generation is removed, not written) and at every save interval, where it forgets the scope (the
source evicts its outputs). No clock decides it: a tombstone dated ahead hides nothing. A tombstone goes only
once it is older than the age bound and its scope holds no file, so no purged file outlives it.

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
import secrets
import stat
import threading
import time
from collections import OrderedDict

import numpy as np

from freespec import confined
from freespec.proposers.learned import state_dir
from freespec.proposers.learned.file_worker import FileWorker
from freespec.proposers.learned.response_store import ResponseStore, ResponseStoreError, file_bytes, read_fingerprint

logger = logging.getLogger("freespec")

PURGED = state_dir.TOMBSTONES  # the tombstones' folder under <state_dir>/suffix
MERGE_FILES = 64  # peers' files read per save interval, all scopes together


GENERATION_BYTES = 64  # a tombstone holds a generation of 32 hex digits


def tombstone_dir(root: str) -> str:
    return os.path.join(root, PURGED)


def fingerprint_for(fingerprint: str, generation: str | None) -> str:
    """The fingerprint of a scope's files: the tokenizer's, and the purge generation they were written under."""
    return fingerprint if generation is None else f"{fingerprint} purge:{generation}"


def purge_scope(root: str, scope: str) -> list[str]:
    """Leave ``scope``'s tombstone with a new generation, then remove every file of the scope under ``root``
    (``<state_dir>/suffix``); the paths removed. The fact comes first: once the tombstone is written no replica
    keeps the scope, whatever the removal meets (an entry it cannot remove is left and named in the log, and is
    never read again: it is of an older generation). A link at the scope's name is removed itself, never
    followed, and so is every other link below the state directory (``root``'s folder, this process's boundary)."""
    state_dir.open_root(os.path.dirname(os.path.abspath(root)))
    marks = tombstone_dir(root)
    confined.makedirs(marks)
    generation = secrets.token_hex(16)
    confined.write_atomic(os.path.join(marks, scope), f".{scope}.{os.getpid()}.{secrets.token_hex(4)}.tmp",
                          lambda f: f.write(generation.encode()), state_dir.FILE_MODE)
    folder = os.path.join(root, scope)
    try:
        st = confined.lstat(folder)
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(st.st_mode):
        confined.unlink(folder)
        return [folder]
    gone = []
    for name, est in confined.entries(folder):
        path = os.path.join(folder, name)
        try:
            if stat.S_ISDIR(est.st_mode):
                raise IsADirectoryError(f"{path!r} is a folder, not a file of freespec's")
            if confined.unlink(path):
                gone.append(path)
        except OSError as e:
            logger.warning("freespec state purge: %s left in place (%s); the scope is purged all the same", path, e)
    try:
        confined.rmdir(folder)
    except OSError:
        pass
    return gone


def _scope_of(path: str) -> str:
    """The scope of a file ``<root>/<scope>/<writer>.bin``."""
    return os.path.basename(os.path.dirname(path))


def _is_scope(name: str) -> bool:
    return len(name) == 32 and all(c in "0123456789abcdef" for c in name)


class Tombstones:
    """The purge generation of each tombstoned scope, read from ``<root>/purged`` (a file read again only when
    it changed). One per writer; read in the background thread and at start."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._cache: dict[str, tuple[tuple, str]] = {}
        self.generations: dict[str, str] = {}

    def read(self, now: float | None = None) -> dict[str, str]:
        now = time.time() if now is None else now
        marks = tombstone_dir(self.root)
        found = {}
        for name, st in confined.entries(marks):
            if not _is_scope(name) or not stat.S_ISREG(st.st_mode):
                continue
            path = os.path.join(marks, name)
            try:
                st = state_dir.redated(path, st, now)
            except OSError:
                pass  # read as it is: a generation is decided by its content
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            cached = self._cache.get(name)
            if cached is not None and cached[0] == key:
                found[name] = cached[1]
                continue
            try:
                text = confined.read_small(path, GENERATION_BYTES).decode("ascii", "replace").strip()
            except (OSError, ValueError) as e:
                logger.warning("freespec: suffix state_dir: tombstone %s unreadable (%s); its scope stays purged "
                               "by its date", path, e)
                text = ""
            generation = text if text else f"mtime-{st.st_mtime_ns}"  # a tombstone of an earlier freespec
            self._cache[name] = (key, generation)
            found[name] = generation
        self.generations = found
        return found

    def sweep(self, max_age_s: float, now: float | None = None) -> None:
        """Remove tombstones older than ``max_age_s`` whose scope holds no file (a file there may be purged text
        that only its tombstone keeps dead)."""
        now = time.time() if now is None else now
        marks = tombstone_dir(self.root)
        for name, st in confined.entries(marks):
            path = os.path.join(marks, name)
            try:
                st = state_dir.redated(path, st, now)
                if now - st.st_mtime > max_age_s and not confined.entries(os.path.join(self.root, name)):
                    confined.unlink(path)
            except OSError:
                pass


class ScopedResponses:
    """Per-scope response stores of one writer (see the module docstring)."""

    def __init__(self, root: str, *, fingerprint: str, vocab_size: int, max_responses: int, max_tokens: int,
                 max_age_s: float, max_bytes: int, purged=None) -> None:
        self.root, self.fingerprint, self.vocab_size = root, fingerprint, vocab_size
        self.max_responses, self.max_tokens, self.max_age_s = max_responses, max_tokens, max_age_s
        self.max_bytes = max_bytes
        self.purged = purged  # what purges by age or writer removed (``proposers.learned.purges``), for every store
        self.writer = state_dir.writer_id()
        self.stores: OrderedDict[str, ResponseStore] = OrderedDict()  # least recently used first
        self._dirty: set[str] = set()
        self._unsaved: dict = {}  # store -> True, handed to the background thread and not yet written
        self._unsaved_lock = threading.Lock()
        self.tombstones = Tombstones(root)
        self._seen_tombstones: dict[str, str] = {}  # scope -> the generation this writer's stores are of
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
                    path, fingerprint=self._fingerprint(scope), vocab_size=self.vocab_size,
                    max_responses=self.max_responses, purged=self.purged,
                    max_tokens=self.max_tokens, perms=state_dir.FILE_MODE, check_folder=False)
                if not touch:
                    self.stores.move_to_end(scope, last=False)
            if touch:
                self.stores.move_to_end(scope)
            return store

    def _fingerprint(self, scope: str) -> str:
        return fingerprint_for(self.fingerprint, self._seen_tombstones.get(scope))

    def _purged_file(self, path: str, current: str) -> bool:
        """Whether ``path`` is a scope's file of an older purge generation than ``current`` (purged text: removed
        here, whoever wrote it). A file of another tokenizer is not (it is refused as foreign when read)."""
        theirs = read_fingerprint(path)
        if theirs is None or theirs == current or theirs.split(" purge:", 1)[0] != self.fingerprint:
            return False
        try:
            confined.unlink(path)
            logger.info("freespec: suffix state_dir: %s removed: written before its scope was purged", path)
        except OSError:
            pass
        return True

    def _files_of(self, scope: str, now: float, sweep: bool = False) -> list[tuple[str, os.stat_result]]:
        """The store files in ``scope``'s folder (this writer's and its peers': regular files, not temporaries,
        within the age bound), from one listing; ``sweep``: what is past the bound (or dated ahead) is removed."""
        folder = os.path.join(self.root, scope)
        out = []
        for name, st in confined.entries(folder):
            if stat.S_ISDIR(st.st_mode):
                continue
            if state_dir.age(st.st_mtime, now) > self.max_age_s:
                if sweep:
                    try:
                        confined.unlink(os.path.join(folder, name))
                    except OSError:
                        pass
                continue
            if stat.S_ISREG(st.st_mode) and name.endswith(".bin") and not name.startswith("."):
                out.append((name, st))
        return out

    def load(self) -> dict[str, list[np.ndarray]]:
        """At start: the newest ``MERGE_FILES`` files of all scope folders (this writer's and its peers'; the
        rest merge in the background, ``MERGE_FILES`` an interval), of the scope's purge generation; a bad file
        is skipped. The responses held then, by scope: within the bounds, however many files there are."""
        self.tombstones.sweep(self.max_age_s)
        self._seen_tombstones = dict(self.tombstones.read())
        candidates = []
        now = time.time()
        for scope, st in confined.entries(self.root):
            if not _is_scope(scope) or not stat.S_ISDIR(st.st_mode):
                continue
            for name, fst in self._files_of(scope, now, sweep=True):
                if name == f"{self.writer}.bin":
                    self._on_disk[scope] = fst.st_size  # an earlier incarnation's, taken back
                candidates.append((fst.st_mtime, scope, os.path.join(self.root, scope, name)))
        candidates.sort(reverse=True)  # newest first
        for _, scope, path in sorted(candidates[:MERGE_FILES]):  # oldest first, as the responses were added
            store = self._store(scope)
            if self._purged_file(path, store.fingerprint):
                continue
            try:
                st = confined.lstat(path)
                store.merge_from(path)
                self._peer_seen[path] = (st.st_mtime_ns, st.st_size)
            except FileNotFoundError:
                continue
            except (OSError, ResponseStoreError) as e:
                logger.warning("freespec: suffix state_dir: %s skipped (%s)", path, e)
            self._bound()
        self._hold_bytes({})  # this writer's earlier incarnation's files, written under a larger bound
        with self._stores_lock:
            return {scope: store.responses() for scope, store in self.stores.items() if len(store)}

    def drop_purged(self, purged) -> int:
        """Forget in every scope what a purge by age or writer removed (``proposers.learned.purges``); how many."""
        with self._stores_lock:
            stores = list(self.stores.items())
        gone = 0
        for scope, store in stores:
            n = store.drop_purged(purged)
            if n:
                gone += n
                self._dirty.add(scope)
        return gone

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
                    work.append(("forget", store))
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
            elif what == "forget":  # a purged scope's store: its file goes unless already of the new generation
                current = fingerprint_for(self.fingerprint, self.tombstones.read().get(_scope_of(target.path)))
                if confined.exists(target.path) and self._purged_file(target.path, current):
                    self._on_disk.pop(_scope_of(target.path), None)
                continue
            try:
                confined.unlink(target)
            except OSError:
                pass
            self._on_disk.pop(_scope_of(target), None)
        for store, stored in self._hold_bytes(self._unpurged(planned)).items():
            try:
                state_dir.source_dir(self.root, _scope_of(store.path))
            except OSError:
                pass  # the save below says why it cannot write
            self._save(store, stored)

    def _unpurged(self, planned: dict) -> dict:
        """Of the saves ``planned``, those of stores of their scope's current purge generation, the tombstones read
        now (right before the save): a store that predates a purge is never written; its file, if any, goes."""
        generations = self.tombstones.read()
        keep = {}
        for store, stored in planned.items():
            current = fingerprint_for(self.fingerprint, generations.get(_scope_of(store.path)))
            if store.fingerprint == current:
                keep[store] = stored
            elif confined.exists(store.path):
                self._purged_file(store.path, current)
        return keep

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
                    confined.unlink(store.path)
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
        them), as one result. A file of an older purge generation is removed, never read."""
        if self.purged is not None:
            self.purged()  # new purge records (by age or writer): the engine's thread acts on them
        marks = self.tombstones.read()
        new = [s for s, g in marks.items() if self._seen_tombstones.get(s) != g]
        self._seen_tombstones.update(marks)
        merges, reads, now = [], 0, time.time()
        for scope, st in confined.entries(self.root):
            if reads >= MERGE_FILES:
                break
            if not _is_scope(scope) or scope in new or not stat.S_ISDIR(st.st_mode):
                continue
            current = fingerprint_for(self.fingerprint, marks.get(scope))
            for name, pst in sorted(self._files_of(scope, now), key=lambda f: f[1].st_mtime):
                path = os.path.join(self.root, scope, name)
                if name == f"{self.writer}.bin" or self._peer_seen.get(path) == (pst.st_mtime_ns, pst.st_size):
                    continue  # unchanged: no store made for it (nor brought back after the byte bound dropped it)
                reads += 1  # a file that fails to read counts too: a folder of bad files costs no more
                if self._purged_file(path, current):
                    continue
                store = self._store(scope, touch=False)
                prepared = store._read_peer(path, self._peer_seen, self._peer_errors)
                if prepared is not None:
                    merges.append((scope, store, prepared))
                if reads >= MERGE_FILES:
                    break
        if new or merges:
            yield new, merges

    def close(self) -> None:
        """The final save of every changed store, in this thread (at exit; never raises): the tombstones are read
        first, so a writer stopping right after a purge writes nothing of the purged scope."""
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
                    confined.unlink(store.path)
                except OSError:
                    pass
                self._on_disk.pop(_scope_of(store.path), None)
        try:
            planned = self._unpurged(planned)
        except Exception:  # noqa: BLE001 - never raises at exit; nothing of a scope is written then
            logger.exception("freespec: suffix state_dir: tombstones unreadable at exit; scoped responses not saved")
            planned = {}
        for store, stored in self._hold_bytes(planned).items():
            try:
                confined.makedirs(os.path.dirname(store.path))
            except OSError:
                pass  # its save says why it cannot write
            self._save(store, stored, timeout=10.0, final=True)
