"""The ``suffix`` source's salted scopes (tenants with a ``cache_salt``) in a state directory: their purge.

Each scope's learned responses are in its own folder, ``<state_dir>/suffix/<scope>/`` (each writer's log segments,
``folder_log``). ``freespec state purge --scope SALT`` (``purge_scope``) leaves a tombstone first,
``<state_dir>/suffix/purged/<scope>``, holding a new random purge generation, then removes every file of the
scope's folder. A scope's segments are written for the generation their writer knew (in the fingerprint of their
header, ``fingerprint_for``): once a tombstone names a new one, a segment of an older generation is purged text
whoever wrote it and whenever: never read, and removed by whichever process sees it. Each writer reads the
tombstones every round before it appends (its own segments of an old generation are removed, nothing of the
scope it held is appended) and forgets the scope (the source evicts its outputs). No clock decides it: a
tombstone dated ahead hides nothing. A tombstone goes only once it is older than the age bound and its scope
holds no file, so no purged file outlives it.
"""
from __future__ import annotations

import logging
import os
import secrets
import stat
import time

from freespec import confined
from freespec.proposers.learned import state_dir

logger = logging.getLogger("freespec")

PURGED = state_dir.TOMBSTONES  # the tombstones' folder under <state_dir>/suffix


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
