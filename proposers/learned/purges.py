"""Purges that stick: what ``freespec state purge`` removed by age, by writer or in whole, as a fact every replica
honours (a tenant's scope has its own rule: ``scoped_responses``).

A purge first records what it removes, then removes it: ``<state_dir>/purged/<id>.purge``. A purge by writer
records the digests of every response in that writer's files (the first 8 bytes of ``response_store``'s
digest of the tokens) and the time of the purge: a response is purged when its digest is recorded and its
stamp is not later than that time. A purge by age, or in whole, records a cutoff instead: every response
stamped before it is purged. Both record recycle's row stamp up to which rows are purged. From then on,
whatever the order of saves, stops and starts:

- a purged response is dropped from every replica's memory at its next save interval (the suffix source then
  rebuilds its trees from what its backend kept), filtered out of every append (never written back), out of
  every record read (never loaded again), and out of each writer's own segments, which it compacts on seeing
  the purge (``folder_log``);
- recycle rows stamped at or before the recorded stamp are cleared and never merged back (rows carry no
  writer, so a purge by writer takes other writers' rows of that age too: recycle relearns them);
- the same text learned again later is a new response (a later stamp) and is kept. Stamps come from each
  server's clock, so every comparison is taken ``CLOCK_SLACK_S`` (5 minutes, the one skew allowed) later: a
  response stamped by a clock ahead is still caught, and what is learned within 5 minutes after a purge by age
  or in whole goes with it.

A record is kept for ``state_max_age_s`` and a day more, longer than any file that could still hold what it
names; one dated ahead of the clock is re-dated to now.

File format (little-endian): ``MAGIC``, the recycle stamp (int64 seconds, 0: none), the time or cutoff (int64
ns), the digest count (uint64), the digests (uint64, sorted); its exact size is checked, and all records together
hold at most ``MAX_DIGESTS``.
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
from freespec.proposers.learned.state_dir import CLOCK_SLACK_NS, CLOCK_SLACK_S, TOMBSTONES, redated

logger = logging.getLogger("freespec")

FOLDER = TOMBSTONES  # <state_dir>/purged: the records of purges by age, writer or in whole
SUFFIX = ".purge"
MAGIC = b"FSPURGE1"
_HEAD = struct.Struct("<8sqqQ")
MAX_DIGESTS = 1 << 22  # all records together: 32 MB of digests, 4,194,304 responses
KEEP_EXTRA_S = 86_400.0
SLACK_NS = CLOCK_SLACK_NS


def digests_of(entries_digests: list[bytes]) -> np.ndarray:
    """The purge keys of 16-byte response digests: their first 8 bytes as uint64."""
    if not entries_digests:
        return np.zeros(0, dtype="<u8")
    return np.frombuffer(b"".join(d[:8] for d in entries_digests), dtype="<u8").copy()


@dataclass(frozen=True)
class Purged:
    """All purges recorded so far, as one fact: purged digests (sorted, unique) each with the time of its latest
    purge, the latest cutoff of purges by age or in whole, and recycle's row stamp."""

    digests: np.ndarray
    digest_before: np.ndarray  # int64 ns: a response with this digest stamped up to then is purged
    before_ns: int = 0  # every response stamped before this is purged
    recycle_before: int = 0
    version: tuple = ()

    def __bool__(self) -> bool:
        return bool(len(self.digests)) or self.before_ns > 0 or self.recycle_before > 0

    def drops(self, keys: np.ndarray, stamps: np.ndarray) -> np.ndarray:
        """A boolean mask: which responses (their keys, uint64, and stamps, ns) are purged. Each time is taken
        ``SLACK_NS`` later: a response stamped by a clock ahead (peers' stamps may be up to that far ahead, and
        a replica's own stamps follow the newest it merged) is still caught; what is learned that soon after a
        purge goes with it."""
        stamps = np.asarray(stamps, dtype=np.int64)
        out = stamps < self.before_ns + SLACK_NS if self.before_ns else np.zeros(len(stamps), dtype=bool)
        if len(self.digests) and len(keys):
            at = np.searchsorted(self.digests, keys)
            at[at == len(self.digests)] = 0
            out |= (self.digests[at] == keys) & (stamps <= self.digest_before[at] + SLACK_NS)
        return out

    @property
    def recycle_cut(self) -> int:
        """Recycle rows stamped up to this (seconds) are purged: the recorded stamp, ``CLOCK_SLACK_S`` later."""
        return self.recycle_before + int(CLOCK_SLACK_S) if self.recycle_before else 0


NOTHING = Purged(np.zeros(0, dtype="<u8"), np.zeros(0, dtype=np.int64))


def write_record(state_dir: str, *, digests: np.ndarray | None = None, before_ns: int,
                 recycle_before: int = 0) -> str:
    """Record a purge (before its files are removed): with ``digests``, those responses stamped up to
    ``before_ns``; without, every response stamped before ``before_ns``. The record's path."""
    folder = os.path.join(state_dir, FOLDER)
    confined.makedirs(folder)
    keys = np.unique(np.asarray(digests if digests is not None else [], dtype="<u8"))
    kind = -1 if digests is not None else 1  # the sign tells the two kinds apart
    name = f"{time.time_ns():020d}-{secrets.token_hex(4)}{SUFFIX}"
    path = os.path.join(folder, name)
    head = _HEAD.pack(MAGIC, int(recycle_before), kind * int(before_ns), len(keys))
    confined.write_atomic(path, f".{name}.tmp", lambda f: (f.write(head), f.write(keys.tobytes())), 0o600)
    return path


def _read_record(path: str, size: int) -> tuple[np.ndarray, int, int, int]:
    """(digests, digests' time, cutoff, recycle stamp) of a record; ValueError if it is not a whole one."""
    if size < _HEAD.size or (size - _HEAD.size) % 8 or (size - _HEAD.size) // 8 > MAX_DIGESTS:
        raise ValueError(f"purge record {path!r}: {size} bytes is not a record's size")
    data = confined.read_small(path, size)
    magic, recycle_before, when, count = _HEAD.unpack_from(data)
    if magic != MAGIC or len(data) != _HEAD.size + 8 * count or recycle_before < 0 or when == 0:
        raise ValueError(f"purge record {path!r}: not a freespec purge record, or damaged")
    digests = np.frombuffer(data, dtype="<u8", offset=_HEAD.size).copy()
    return (digests, -when, 0, recycle_before) if when < 0 else (digests, 0, when, recycle_before)


def _combined(records: list[tuple], version: tuple) -> Purged:
    """One ``Purged`` of many records: each digest with its latest purge time."""
    parts = [(r[1], np.full(len(r[1]), r[2], dtype=np.int64)) for r in records if len(r[1])]
    if parts:
        digests = np.concatenate([p[0] for p in parts])
        times = np.concatenate([p[1] for p in parts])
        order = np.lexsort((times, digests))  # by digest, then time: the last of each digest is its latest
        digests, times = digests[order], times[order]
        last = np.append(digests[1:] != digests[:-1], True)
        digests, times = digests[last], times[last]
    else:
        digests, times = NOTHING.digests, NOTHING.digest_before
    return Purged(digests, times, max((r[3] for r in records), default=0),
                  max((r[4] for r in records), default=0), version)


class PurgeLog:
    """One process's view of ``<state_dir>/purged`` (each record read once; ``current`` in any thread reads the
    folder's listing and any new record; ``latest`` is the last result, without I/O, for the engine's thread)."""

    def __init__(self, state_dir: str) -> None:
        self.folder = os.path.join(state_dir, FOLDER)
        self._records: dict[str, tuple] = {}  # name -> (stat key, digests, their time, cutoff, recycle stamp)
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
            now = time.time()
            for name, st in sorted(listing.items()):
                path = os.path.join(self.folder, name)
                try:
                    st = redated(path, st, now)
                except OSError:
                    continue
                key = (st.st_ino, st.st_mtime_ns, st.st_size)
                if self._records.get(name, (None,))[0] == key:
                    continue
                try:
                    digests, when, cutoff, recycle_before = _read_record(path, st.st_size)
                    if total + len(digests) > MAX_DIGESTS:
                        raise ValueError(f"purge records hold more than {MAX_DIGESTS:,} responses in all")
                except (OSError, ValueError) as e:
                    if name not in self._warned:
                        self._warned.add(name)
                        logger.warning("freespec: state_dir: purge record skipped (%s)", e)
                    continue
                # never later than the record's own date: a record that says the future hides no later learning
                record = (digests, min(when, st.st_mtime_ns), min(cutoff, st.st_mtime_ns),
                          min(recycle_before, int(st.st_mtime)))
                self._records[name] = (key, *record)
                total += len(record[0])
            version = tuple(sorted((n, r[0]) for n, r in self._records.items()))
            if version != self.latest.version:
                self.latest = _combined(list(self._records.values()), version)
            return self.latest

    def sweep(self, max_age_s: float, now: float | None = None) -> None:
        """Remove records older than ``max_age_s`` and a day (no file they name can remain by then)."""
        now = time.time() if now is None else now
        for name, st in confined.entries(self.folder):
            if not name.endswith(SUFFIX):
                continue
            path = os.path.join(self.folder, name)
            try:
                if now - redated(path, st, now).st_mtime > max_age_s + KEEP_EXTRA_S:
                    confined.unlink(path)
            except OSError:
                pass
