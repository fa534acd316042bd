"""Purges that stick: what ``freespec state purge`` removed by age, by writer or in whole, as a fact every replica
honours (a tenant's scope has its own rule: ``scoped_responses``).

A purge first records what the files it removes held, then removes them: ``<state_dir>/purged/<id>.purge``
holds the digests of every response in them (the first 8 bytes of ``response_store``'s digest of the tokens)
and the newest recycle row stamp they held. From then on, whatever the order of saves, stops and starts:

- a response with a purged digest is dropped from every store at its next save interval (the suffix source then
  rebuilds its trees from what its stores kept), filtered out of every save right before it is written (never
  written back, even by a save already asked for), and out of every file read (never merged or loaded again);
- recycle rows stamped at or before the newest purged row are cleared and never merged back (rows carry no
  writer, so this takes other writers' rows of that age too: recycle relearns them from the target).

Nothing here depends on clocks but the operator's own ``--older-than``, which picks the files. A record is kept
for ``state_max_age_s`` and a day more: longer than any file that could still hold what it names.

File format (little-endian): ``MAGIC``, the recycle stamp (int64 seconds, 0: none), the digest count (uint64),
the digests (uint64, sorted); its exact size is checked, and all records together hold at most ``MAX_DIGESTS``.
"""
from __future__ import annotations

import logging
import os
import secrets
import stat
import struct
import threading
import time
from dataclasses import dataclass

import numpy as np
from freespec import confined

logger = logging.getLogger("freespec")

FOLDER = "purged"  # <state_dir>/purged: the records of purges by age, writer or in whole
SUFFIX = ".purge"
MAGIC = b"FSPURGE1"
_HEAD = struct.Struct("<8sqQ")
MAX_DIGESTS = 1 << 22  # all records together: 32 MB of digests, 4,194,304 responses
KEEP_EXTRA_S = 86_400.0


def digests_of(entries_digests: list[bytes]) -> np.ndarray:
    """The purge keys of 16-byte response digests: their first 8 bytes as uint64."""
    if not entries_digests:
        return np.zeros(0, dtype="<u8")
    return np.frombuffer(b"".join(d[:8] for d in entries_digests), dtype="<u8").copy()


@dataclass(frozen=True)
class Purged:
    """All purges recorded so far, as one fact: digests (sorted, unique) and the recycle stamp."""

    digests: np.ndarray
    recycle_before: int = 0
    version: tuple = ()

    def __bool__(self) -> bool:
        return bool(len(self.digests)) or self.recycle_before > 0

    def drops(self, keys: np.ndarray) -> np.ndarray:
        """A boolean mask: which of ``keys`` (uint64) are purged."""
        if not len(self.digests) or not len(keys):
            return np.zeros(len(keys), dtype=bool)
        at = np.searchsorted(self.digests, keys)
        at[at == len(self.digests)] = 0
        return self.digests[at] == keys


NOTHING = Purged(np.zeros(0, dtype="<u8"))


def write_record(state_dir: str, digests: np.ndarray, recycle_before: int) -> str:
    """Record a purge (before its files are removed); the record's path."""
    folder = os.path.join(state_dir, FOLDER)
    confined.makedirs(folder)
    keys = np.unique(np.asarray(digests, dtype="<u8"))
    name = f"{time.time_ns():020d}-{secrets.token_hex(4)}{SUFFIX}"
    path = os.path.join(folder, name)
    confined.write_atomic(path, f".{name}.tmp", lambda f: (f.write(_HEAD.pack(MAGIC, int(recycle_before), len(keys))),
                                                          f.write(keys.tobytes())), 0o600)
    return path


def _read_record(path: str, size: int) -> tuple[np.ndarray, int]:
    if size < _HEAD.size or (size - _HEAD.size) % 8 or (size - _HEAD.size) // 8 > MAX_DIGESTS:
        raise ValueError(f"purge record {path!r}: {size} bytes is not a record's size")
    data = confined.read_small(path, size)
    magic, recycle_before, count = _HEAD.unpack_from(data)
    if magic != MAGIC or len(data) != _HEAD.size + 8 * count or recycle_before < 0:
        raise ValueError(f"purge record {path!r}: not a freespec purge record, or damaged")
    return np.frombuffer(data, dtype="<u8", offset=_HEAD.size).copy(), int(recycle_before)


class PurgeLog:
    """One process's view of ``<state_dir>/purged`` (each record read once; ``current`` in any thread reads the
    folder's listing and any new record; ``latest`` is the last result, without I/O, for the engine's thread)."""

    def __init__(self, state_dir: str) -> None:
        self.folder = os.path.join(state_dir, FOLDER)
        self._records: dict[str, tuple[tuple, np.ndarray, int]] = {}
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self.latest = NOTHING

    def current(self) -> Purged:
        with self._lock:
            listing = {name: st for name, st in confined.entries(self.folder)
                       if name.endswith(SUFFIX) and stat.S_ISREG(st.st_mode)}
            for name in [n for n in self._records if n not in listing]:
                del self._records[name]
            total = sum(len(r[1]) for r in self._records.values())
            for name, st in sorted(listing.items()):
                key = (st.st_ino, st.st_mtime_ns, st.st_size)
                if self._records.get(name, (None,))[0] == key:
                    continue
                try:
                    digests, recycle_before = _read_record(os.path.join(self.folder, name), st.st_size)
                    if total + len(digests) > MAX_DIGESTS:
                        raise ValueError(f"purge records hold more than {MAX_DIGESTS:,} responses in all")
                except (OSError, ValueError) as e:
                    if name not in self._warned:
                        self._warned.add(name)
                        logger.warning("freespec: state_dir: purge record skipped (%s)", e)
                    continue
                self._records[name] = (key, digests, recycle_before)
                total += len(digests)
            version = tuple(sorted((n, r[0]) for n, r in self._records.items()))
            if version != self.latest.version:
                parts = [r[1] for r in self._records.values()]
                digests = np.unique(np.concatenate(parts)) if parts else NOTHING.digests
                self.latest = Purged(digests, max((r[2] for r in self._records.values()), default=0), version)
            return self.latest

    def sweep(self, max_age_s: float, now: float | None = None) -> None:
        """Remove records older than ``max_age_s`` and a day (no file they name can remain by then)."""
        from freespec.proposers.state_dir import age

        now = time.time() if now is None else now
        for name, st in confined.entries(self.folder):
            if not name.endswith(SUFFIX):
                continue
            path = os.path.join(self.folder, name)
            try:
                if age(st.st_mtime, now) == float("inf"):  # dated ahead: it ages from now on, never forever
                    confined.touch(path, now)
                elif age(st.st_mtime, now) > max_age_s + KEEP_EXTRA_S:
                    confined.unlink(path)
            except OSError:
                pass
