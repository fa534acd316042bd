"""The ``suffix`` source's learned responses shared through a folder (``state_dir: /path``) as an append-only log.

Each writer (``state_dir.writer_id``) appends each response it learns once, as one checked record, to its own
segment of the response's scope: ``<state_dir>/suffix/<writer>.<seq>.log`` for the shared scope,
``<state_dir>/suffix/<scope>/<writer>.<seq>.log`` for a salted one (one folder per scope, so that a scope's purge
removes its text from disk by removing that folder's files: ``scoped_responses.purge_scope``). A reader keeps a
byte offset per peer segment and reads only the bytes added since, on this backend's thread, at most
``ROUND_BYTES`` a round; so a replica's cost follows the fleet's traffic, not its size (a listing of the scope
folders aside). A writer never rewrites a store: it compacts its own segments of a scope (their newest records
within the bounds, less what was purged, into a fresh segment ``<seq + 1>``, the older ones removed) once they
hold twice the bounds, or at once when a purge names what they hold. A reader of a removed segment drops its
offset; one of a fresh segment reads it from its start, and ``Held`` keeps one copy of each response (by digest).

Segment format (little-endian, no pickle): ``MAGIC``, a header (``_HEAD``: vocabulary size, the byte lengths of
the fingerprint, the writer and the scope), the tokenizer fingerprint with the scope's purge generation
(``scoped_responses.fingerprint_for``), the writer, the scope (``""``: shared), then an 8-byte BLAKE2b of all that;
then records: ``_REC`` (``REC_MAGIC``, token count, stamp in ns by the writer's clock), the tokens (int32), an
8-byte BLAKE2b of the header's checksum, ``_REC`` and the tokens, so a record names its scope, fingerprint and
writer through its segment. A record is refused (and the rest of its segment with it, until the segment is
replaced) when it is damaged, longer than ``max_saved_tokens``, holds ids outside the vocabulary or is stamped
past now + ``CLOCK_SLACK_S``; one whose bytes are not all there yet (a writer mid-append) is read at the next round.
A segment of another tokenizer is refused; one of an older purge generation is purged text: never read, and
removed by whoever sees it. Another user's file, or one writable by others, is refused unless
``state_dir_trust_others``; no link below ``state_dir`` is followed (``freespec.confined``).

Start: the newest ``state_dir.START_FILES`` segments (all scopes) are read whole, into the bounds
(``max_saved_responses``/``max_saved_tokens`` for the shared scope, as much again for all salted scopes); other
segments are followed from their current end. Retention: a segment not written for ``max_age_s`` (or dated ahead
of this clock) is removed by whoever sees it; records older than that are not read, and compaction drops them;
this writer's segments of all salted scopes together stay within ``state_max_mb``, the least recently used
scopes' going first. Purges (``proposers.learned.purges``, by writer, age or in whole) filter every read and
append, and make this writer compact what it holds on disk. Snapshots (``response_store``) are no longer written
here; an earlier freespec's ``.bin`` files are not read and go by age.

Threads: ``add``/``take`` touch memory only; every file operation is on the thread ``freespec-folder-log``, one
round per ``interval_s`` (``save_every_s``; 0: only at start and ``close``). The start's read is in the caller's
thread (the engine's start), as ``close``'s last append (bounded by its timeout).
"""
from __future__ import annotations

import hashlib
import logging
import os
import stat
import struct
import threading
import time
from collections import deque

import numpy as np

from freespec import confined
from freespec.proposers.api import SHARED_SCOPE
from freespec.proposers.learned import Learned, LearnedResponses, state_dir
from freespec.proposers.learned.purges import NOTHING, PurgeLog, digests_of
from freespec.proposers.learned.redis_stream import Held
from freespec.proposers.learned.response_store import _digest
from freespec.proposers.learned.scoped_responses import Tombstones, fingerprint_for

logger = logging.getLogger("freespec")

EXT = ".log"
MAGIC = b"\x89FSLOG1\n"
_HEAD = struct.Struct("<IHHH")  # vocabulary size, fingerprint, writer and scope lengths
_REC = struct.Struct("<IIq")  # REC_MAGIC, token count, stamp (ns)
REC_MAGIC = 0x31434552  # "REC1"
SUM_BYTES = 8
MAX_HEADER_BYTES = len(MAGIC) + _HEAD.size + 1024 + 160 + 32 + SUM_BYTES
ROUND_BYTES = 32 << 20  # read from peers' segments per round, all together (the rest at the next)
TAKE_PER_CALL = 512  # records the engine's thread applies per ``take``


def _sum(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=SUM_BYTES)
    for p in parts:
        h.update(p)
    return h.digest()


def segment_header(fingerprint: str, vocab_size: int, writer: str, scope: str) -> bytes:
    fp, w, s = fingerprint.encode(), writer.encode(), scope.encode()
    head = MAGIC + _HEAD.pack(vocab_size, len(fp), len(w), len(s)) + fp + w + s
    return head + _sum(head)


def encode_record(header_sum: bytes, tokens: np.ndarray, stamp: int) -> bytes:
    rec = _REC.pack(REC_MAGIC, len(tokens), stamp)
    body = tokens.astype("<i4", copy=False).tobytes()
    return rec + body + _sum(header_sum, rec, body)


class BadSegment(ValueError):
    """A segment (or a record of it) refused; ``kind`` names the check it failed (logged once per kind)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


def parse_header(data: bytes) -> tuple[str, int, str, str, bytes, int] | None:
    """(fingerprint, vocabulary size, writer, scope, checksum, header bytes) of a segment's first bytes; None when
    they are not all there yet; ``BadSegment`` when they are not a segment's."""
    if data[: len(MAGIC)] != MAGIC[: len(data)]:
        raise BadSegment("not a segment", "its first bytes are not a freespec log segment's")
    if len(data) < len(MAGIC) + _HEAD.size:
        return None
    vocab, nf, nw, ns = _HEAD.unpack_from(data, len(MAGIC))
    end = len(MAGIC) + _HEAD.size + nf + nw + ns
    if end + SUM_BYTES > MAX_HEADER_BYTES:
        raise BadSegment("bad header", "header fields out of range")
    if len(data) < end + SUM_BYTES:
        return None
    checksum = data[end: end + SUM_BYTES]
    if _sum(data[:end]) != checksum:
        raise BadSegment("bad header", "header checksum mismatch")
    at = len(MAGIC) + _HEAD.size
    fp, w, s = data[at: at + nf], data[at + nf: at + nf + nw], data[at + nf + nw: end]
    return (fp.decode("utf-8", "replace"), vocab, w.decode("ascii", "replace"), s.decode("ascii", "replace"),
            checksum, end + SUM_BYTES)


def parse_records(data: memoryview, header_sum: bytes, vocab_size: int, max_tokens: int, now_ns: int):
    """(records, bytes used) of ``data`` (whole records from its start): records as (tokens, stamp); a last record
    not all there is left for later. ``BadSegment`` at the first bad record (the records before it are lost too:
    the caller refuses the segment)."""
    out, at, n = [], 0, len(data)
    latest = now_ns + state_dir.CLOCK_SLACK_NS
    while n - at >= _REC.size:
        magic, count, stamp = _REC.unpack_from(data, at)
        if magic != REC_MAGIC or count == 0:
            raise BadSegment("damaged record", f"no record at byte {at}")
        if count > max_tokens:
            raise BadSegment("record too long", f"{count} tokens, more than max_saved_tokens {max_tokens}")
        end = at + _REC.size + 4 * count + SUM_BYTES
        if end > n:
            break  # a writer mid-append: read at the next round
        body = data[at + _REC.size: end - SUM_BYTES]
        if _sum(header_sum, data[at: at + _REC.size], body) != bytes(data[end - SUM_BYTES: end]):
            raise BadSegment("damaged record", f"checksum mismatch at byte {at}")
        tokens = np.frombuffer(body, dtype="<i4").astype(np.int32)
        if int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size:
            raise BadSegment("token out of vocabulary", f"ids outside [0, {vocab_size})")
        if not 0 < stamp <= latest:
            raise BadSegment("bad stamp", "not a time in ns up to now + 5 min")
        tokens.flags.writeable = False
        out.append((tokens, int(stamp)))
        at = end
    return out, at


def segment_name(name: str) -> tuple[str, int] | None:
    """(writer, sequence) of a segment's file name ``<writer>.<seq>.log``; None for any other name."""
    if name.startswith(".") or not name.endswith(EXT):
        return None
    writer, _, seq = name[: -len(EXT)].rpartition(".")
    return (writer, int(seq)) if seq.isdigit() and writer else None


def read_segment(path: str, *, vocab_size: int, max_tokens: int, limit: int) -> tuple[str, str, list]:
    """(fingerprint, writer, records) of a whole segment of at most ``limit`` bytes (``freespec state purge``)."""
    data = confined.read_small(path, limit)
    head = parse_header(data)
    if head is None:
        return "", "", []
    fp, _, writer, _, checksum, at = head
    records, _ = parse_records(memoryview(data)[at:], checksum, vocab_size, max_tokens, time.time_ns())
    return fp, writer, records


class _Drops:
    """``purges.Purged`` as ``Held.drop`` asks for it (16-byte digests)."""

    def __init__(self, purged) -> None:
        self.purged = purged

    def drops(self, digests: list[bytes], stamps) -> np.ndarray:
        return self.purged.drops(digests_of(digests), stamps)


class _Own:
    """This writer's open segment of one scope: its path, file identity, generation, and what it holds."""

    __slots__ = ("path", "seq", "ino", "generation", "header_sum", "records", "tokens", "bytes", "used")

    def __init__(self, path: str, seq: int, generation: str | None) -> None:
        self.path, self.seq, self.generation = path, seq, generation
        self.ino, self.header_sum = None, b""
        self.records = self.tokens = self.bytes = 0
        self.used = 0.0


class FolderLog(LearnedResponses):
    """The folder backend (see the module docstring)."""

    def __init__(self, root: str, *, fingerprint: str, vocab_size: int, max_responses: int, max_tokens: int,
                 max_age_s: float = state_dir.DEFAULT_MAX_AGE_S, max_bytes: int = 256_000_000,
                 interval_s: float = 30.0, writer: str | None = None, start: bool = True) -> None:
        state_dir.open_root(root)
        self.root = root
        self.suffix = state_dir.source_dir(root, "suffix")
        self.fingerprint, self.vocab_size = fingerprint, vocab_size
        self.max_responses, self.max_tokens = max_responses, max_tokens
        self.max_age_s, self.max_bytes, self.interval_s = max_age_s, max_bytes, interval_s
        self.writer = writer or state_dir.writer_id()
        self.held = Held(max_responses, max_tokens)
        self.purges = PurgeLog(root)
        self.tombstones = Tombstones(self.suffix)
        self._gens: dict[str, str] = {}  # scope -> the purge generation this writer knows
        self._own: dict[str, _Own] = {}  # scope -> this writer's current segment
        self._pos: dict[str, tuple[int, int, bytes]] = {}  # peer path -> (inode, offset, header checksum)
        self._bad: dict[str, int] = {}  # peer path -> inode refused (read again once replaced)
        self._segment_cap = MAX_HEADER_BYTES + 2 * (4 * max_tokens + max_responses * (_REC.size + SUM_BYTES)) + 1
        self._out: deque = deque(maxlen=max_responses)  # (scope, digest, tokens, stamp) not appended yet
        self._in: deque = deque(maxlen=2 * max_responses)  # others' records read, to apply
        self._forget: list[str] = []
        self._lock = threading.Lock()  # _in, _forget: the file thread's results
        self._io = threading.Lock()  # one file round at a time (the thread's, close's)
        self._purge_applied: tuple = ()
        self._compact_all = False
        self._logged: set[str] = set()
        self._dropped: set[str] = set()  # scopes whose segments ``_hold_bytes`` removed (logged once each)
        self.appended = self.applied = self.refused = self.compactions = self.bytes_read = 0
        self.loaded: list[tuple[str, np.ndarray]] = []
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        if start:
            self.load()
            self._thread = threading.Thread(target=self._run, name="freespec-folder-log", daemon=True)
            self._thread.start()

    # ---------------------------------------------------------------- the engine's thread: memory only
    def add(self, scope: str, tokens: np.ndarray) -> None:
        record = self.held.learn(scope, tokens, self.vocab_size)
        if record is not None:
            self._out.append(record)

    def take(self) -> Learned:
        out = Learned()
        with self._lock:
            out.forget, self._forget = self._forget, []
            for scope in out.forget:
                self.held.forget(scope)
            batch = [self._in.popleft() for _ in range(min(len(self._in), TAKE_PER_CALL))]
        purged = self.purges.latest
        if purged.version != self._purge_applied:
            self._purge_applied = purged.version
            if self.held.drop(_Drops(purged)):
                out.rebuild = self.held.all()
        for scope, key, tokens, stamp in batch:
            if self.held.add(scope, key, tokens, stamp):
                out.new.append((scope, tokens))
                self.applied += 1
        return out

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread, then append what waits (at exit; idempotent; never raises)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if not self._io.acquire(timeout=timeout):
            logger.error("freespec: suffix state_dir: a file round still running after %.0f s at exit; %d "
                         "response(s) not appended", timeout, len(self._out))
            return
        try:
            self._append_waiting()
            self._hold_bytes()
        except Exception as e:  # noqa: BLE001 - never raises at exit
            logger.error("freespec: suffix state_dir: the last append at exit failed (%s: %s); %d response(s) "
                         "lost", type(e).__name__, e, len(self._out))
        finally:
            self._io.release()

    def sync(self) -> None:
        """One file round now, in the caller's thread (tests, tools)."""
        with self._io:
            self._round()

    # ---------------------------------------------------------------- the file thread
    def _run(self) -> None:
        while not self._stop.is_set():
            if self.interval_s <= 0:
                self._wake.wait()
            else:
                self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                with self._io:
                    self._round()
            except Exception:  # noqa: BLE001 - never let the thread die: the next round tries again
                logger.exception("freespec: suffix state_dir: a file round failed; will try again")

    def _round(self) -> None:
        now = time.time()
        before = self.purges.latest.version
        self.purges.current()
        self._tombstones()
        if self.purges.latest.version != before:
            self._compact_all = True  # what a purge names leaves this writer's segments too
        self._append_waiting()
        self._compact(now)
        self._read_peers(now)

    def _tombstones(self) -> None:
        """Scopes purged since the last round: forgotten here, this writer's old segments of them removed."""
        for scope, gen in self.tombstones.read().items():
            if self._gens.get(scope) == gen:
                continue
            known = scope in self._gens
            self._gens[scope] = gen
            own = self._own.pop(scope, None)
            if own is not None:
                for path in self._own_files(scope):
                    self._unlink(path)
            if known or own is not None or self.held.of(scope):
                self._purged_scope(scope)

    def _purged_scope(self, scope: str) -> None:
        with self._lock:
            self._in = deque((g for g in self._in if g[0] != scope), maxlen=self._in.maxlen)
            self._forget.append(scope)
        kept = [w for w in self._out if w[0] != scope]
        self._out.clear()
        self._out.extend(kept)
        for path in [p for p in self._pos if os.path.dirname(p) == self._folder(scope)]:
            del self._pos[path]

    def _folder(self, scope: str) -> str:
        return self.suffix if scope == SHARED_SCOPE else os.path.join(self.suffix, scope)

    def _own_files(self, scope: str) -> list[str]:
        folder = self._folder(scope)
        out = []
        for name, st in confined.entries(folder):
            parsed = segment_name(name)
            if parsed is not None and parsed[0] == self.writer and stat.S_ISREG(st.st_mode):
                out.append((parsed[1], os.path.join(folder, name)))
        return [p for _, p in sorted(out)]

    def _unlink(self, path: str) -> None:
        try:
            confined.unlink(path)
        except OSError:
            pass

    # -------------------------------------------------------------- appending
    def _append_waiting(self) -> None:
        """Append what waits, one write per scope, unless purged since it was learned."""
        if not self._out:
            return
        waiting = []
        while self._out:
            waiting.append(self._out.popleft())
        purged = self.purges.latest
        if purged:
            gone = purged.drops(digests_of([w[1] for w in waiting]), [w[3] for w in waiting])
            waiting = [w for w, g in zip(waiting, gone.tolist()) if not g]
        by_scope: dict[str, list] = {}
        for w in waiting:
            by_scope.setdefault(w[0], []).append(w)
        for scope, records in by_scope.items():
            try:
                self._append(scope, records)
            except OSError as e:
                self._log_once(f"append {e.errno}", "could not append to the state directory (%s: %s); the server "
                               "goes on (logged once per kind)", type(e).__name__, e)

    def _segment(self, scope: str) -> _Own:
        own = self._own.get(scope)
        gen = self._gens.get(scope) if scope != SHARED_SCOPE else None
        if own is None or own.generation != gen:
            existing = [segment_name(os.path.basename(p))[1] for p in self._own_files(scope)]
            seq = max(existing, default=0) + 1
            path = os.path.join(self._folder(scope), f"{self.writer}.{seq}{EXT}")
            own = self._own[scope] = _Own(path, seq, gen)
        return own

    def _append(self, scope: str, records: list) -> None:
        own = self._segment(scope)
        confined.makedirs(os.path.dirname(own.path))
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        with confined.folder(os.path.dirname(own.path)) as dfd:
            fd = os.open(os.path.basename(own.path), flags, state_dir.FILE_MODE, dir_fd=dfd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise confined.PlantedLinkError(f"{own.path!r} is not this writer's segment")
            if st.st_size == 0 or st.st_ino != own.ino:
                if st.st_size:  # replaced behind this writer's back: a fresh segment, never appended to another's
                    os.close(fd)
                    fd = -1
                    self._own.pop(scope, None)
                    return self._append(scope, records)
                header = segment_header(fingerprint_for(self.fingerprint, own.generation), self.vocab_size,
                                        self.writer, scope)
                own.header_sum, own.ino = header[-SUM_BYTES:], st.st_ino
                own.records = own.tokens = 0
                own.bytes = 0
                data = [header]
            else:
                data = []
            data += [encode_record(own.header_sum, tokens, stamp) for _, _, tokens, stamp in records]
            blob = b"".join(data)
            view = memoryview(blob)
            while view:  # one write in all but the rarest case: a reader sees a torn tail at most
                view = view[os.write(fd, view):]
        finally:
            if fd >= 0:
                os.close(fd)
        own.records += len(records)
        own.tokens += sum(len(r[2]) for r in records)
        own.bytes += len(blob)
        own.used = time.monotonic()
        self.appended += len(records)

    # -------------------------------------------------------------- compaction
    def _compact(self, now: float) -> None:
        """Compact this writer's segments that hold twice the bounds (all of them after a purge); then hold its
        salted scopes' segments within ``max_bytes`` (``_hold_bytes``)."""
        every = self._compact_all
        self._compact_all = False
        for scope, own in list(self._own.items()):
            if every or own.records > 2 * self.max_responses or own.tokens > 2 * self.max_tokens:
                self._rewrite(scope, now)
        self._hold_bytes()

    def _hold_bytes(self) -> None:
        """This writer's segments of all salted scopes together within ``max_bytes`` (``state_max_mb``): the least
        recently appended-to scopes' segments removed (what this replica's trees hold of them stays). Only this
        writer's own are counted and removed: a peer's go by age. Logged once per scope, naming only its hash."""
        salted = sorted(((own.used, scope) for scope, own in self._own.items() if scope != SHARED_SCOPE))
        total = sum(self._own[s].bytes for _, s in salted)
        for _, scope in salted:
            if total <= self.max_bytes:
                break
            own = self._own.pop(scope)
            total -= own.bytes
            for path in self._own_files(scope):
                self._unlink(path)
            if scope not in self._dropped:
                self._dropped.add(scope)
                logger.info("freespec: suffix state_dir: scope %s: this writer's segments removed, as its scopes' "
                            "segments together took more than state_max_mb (%.1f MB)", scope, self.max_bytes / 1e6)

    def _rewrite(self, scope: str, now: float) -> None:
        """This writer's segments of ``scope``: their newest records within the bounds, unpurged and younger than
        ``max_age_s``, into a fresh segment (atomically); the older segments removed."""
        paths = self._own_files(scope)
        limit = 2 * self._segment_cap  # twice the bounds, and the round's appends beyond them
        records = []
        for path in paths:
            try:
                fp, writer, recs = read_segment(path, vocab_size=self.vocab_size, max_tokens=self.max_tokens,
                                                limit=limit)
            except (OSError, ValueError) as e:
                self._log_once(f"own {type(e).__name__}", "this writer's segment %s dropped at compaction (%s)",
                               path, e)
                continue
            if fp == fingerprint_for(self.fingerprint, self._gens.get(scope) if scope else None):
                records += recs
        cutoff = int((now - self.max_age_s) * 1e9)
        records = [r for r in records if r[1] >= cutoff]
        purged = self.purges.latest
        if purged and records:
            gone = purged.drops(digests_of([_digest(t) for t, _ in records]), [s for _, s in records])
            records = [r for r, g in zip(records, gone.tolist()) if not g]
        seen, kept, tokens = set(), [], 0
        for t, s in reversed(records):  # newest first, one copy each
            d = _digest(t)
            if d in seen:
                continue
            if len(kept) >= self.max_responses or tokens + len(t) > self.max_tokens:
                break
            seen.add(d)
            kept.append((t, s))
            tokens += len(t)
        kept.reverse()
        seq = max((segment_name(os.path.basename(p))[1] for p in paths), default=0) + 1
        gen = self._gens.get(scope) if scope != SHARED_SCOPE else None
        own = _Own(os.path.join(self._folder(scope), f"{self.writer}.{seq}{EXT}"), seq, gen)
        if kept:
            header = segment_header(fingerprint_for(self.fingerprint, gen), self.vocab_size, self.writer, scope)
            blob = header + b"".join(encode_record(header[-SUM_BYTES:], t, s) for t, s in kept)
            confined.makedirs(os.path.dirname(own.path))
            confined.write_atomic(own.path, f".{os.path.basename(own.path)}.{os.getpid()}.tmp",
                                  lambda f: f.write(blob), state_dir.FILE_MODE)
            st = confined.lstat(own.path)
            own.ino, own.header_sum = st.st_ino, header[-SUM_BYTES:]
            own.records, own.tokens, own.bytes = len(kept), tokens, len(blob)
        own.used = self._own[scope].used if scope in self._own else time.monotonic()
        self._own[scope] = own
        for path in paths:
            self._unlink(path)
        self.compactions += 1

    # -------------------------------------------------------------- reading
    def _segments(self, now: float) -> list[tuple[float, str, str, os.stat_result]]:
        """(mtime, scope, path, lstat) of every segment of every scope, peers' and this writer's; what is older than
        ``max_age_s`` (or dated ahead of this clock) is removed."""
        out = []
        folders = [(SHARED_SCOPE, self.suffix)] + [
            (name, os.path.join(self.suffix, name)) for name, st in confined.entries(self.suffix)
            if stat.S_ISDIR(st.st_mode) and len(name) == 32 and all(c in "0123456789abcdef" for c in name)]
        for scope, folder in folders:
            for name, st in confined.entries(folder):
                if segment_name(name) is None or stat.S_ISDIR(st.st_mode):
                    continue
                path = os.path.join(folder, name)
                if state_dir.age(st.st_mtime, now) > self.max_age_s:
                    self._unlink(path)
                    continue
                out.append((st.st_mtime, scope, path, st))
        return out

    def load(self) -> None:
        """At start: the newest ``START_FILES`` segments read whole (this writer's earlier incarnation's too), the
        others followed from their end. What was read is in ``loaded`` (scope, tokens), oldest first."""
        now = time.time()
        for folder in [self.suffix] + [os.path.join(self.suffix, n) for n, st in confined.entries(self.suffix)
                                       if stat.S_ISDIR(st.st_mode) and n != state_dir.TOMBSTONES]:
            state_dir.sweep_old(folder, self.max_age_s, now)  # any file past the age bound: temporaries, snapshots
        self.tombstones.sweep(self.max_age_s, now)
        self.purges.sweep(self.max_age_s, now)
        self.purges.current()
        self._purge_applied = self.purges.latest.version
        self._gens = dict(self.tombstones.read(now))
        segments = sorted(self._segments(now), reverse=True)  # newest first
        for _, _, path, st in segments[state_dir.START_FILES:]:
            self._pos[path] = (st.st_ino, st.st_size, b"")
        chosen = sorted(segments[: state_dir.START_FILES])
        counted: dict[str, int] = {}
        for _, scope, path, st in chosen:
            got = self._read(scope, path, st, budget=None, now=now)
            if self._is_own(path):
                counted[scope] = counted.get(scope, 0) + len(got)
            for scope, key, tokens, stamp in got:
                self.held.add(scope, key, tokens, stamp)  # within the bounds however many segments there are
        self.loaded = self.held.all()
        for mtime, scope, path, st in sorted(segments):  # an earlier incarnation's (this name): taken back
            if not self._is_own(path):
                continue
            self._pos.pop(path, None)
            own = self._own.get(scope)
            seq = segment_name(os.path.basename(path))[1] + 1
            if own is None or own.seq < seq:
                gen = self._gens.get(scope) if scope != SHARED_SCOPE else None
                fresh = _Own(os.path.join(self._folder(scope), f"{self.writer}.{seq}{EXT}"), seq, gen)
                fresh.bytes, fresh.records = (own.bytes if own else 0), counted.get(scope, 0)
                own = self._own[scope] = fresh
            own.bytes += st.st_size
            own.used = time.monotonic() - max(0.0, now - mtime)
        self._hold_bytes()  # what it left under a larger state_max_mb
        logger.info("freespec: suffix state_dir: %d response(s) read from %d segment(s) at start", len(self.loaded),
                    len(chosen))

    def _is_own(self, path: str) -> bool:
        parsed = segment_name(os.path.basename(path))
        return parsed is not None and parsed[0] == self.writer

    def _read_peers(self, now: float) -> None:
        budget = [ROUND_BYTES]
        segments = self._segments(now)
        present = {p for _, _, p, _ in segments}
        for path in [p for p in self._pos if p not in present]:
            del self._pos[path]  # removed (compacted, purged, aged): its replacement is read from its start
        for path in [p for p in self._bad if p not in present]:
            del self._bad[path]
        for _, scope, path, st in sorted(segments):
            if budget[0] <= 0:
                break
            if self._is_own(path) or self._bad.get(path) == st.st_ino:
                continue
            got = self._read(scope, path, st, budget, now)
            if got:
                with self._lock:
                    self._in.extend(got)

    def _read(self, scope: str, path: str, st: os.stat_result, budget: list | None, now: float) -> list:
        """The new bytes of a segment (from the offset kept), checked: its whole records, unpurged and within the
        age bound, as (scope, digest, tokens, stamp)."""
        ino, offset, header_sum = self._pos.get(path, (st.st_ino, 0, b""))
        if ino != st.st_ino:
            ino, offset, header_sum = st.st_ino, 0, b""
        if st.st_size <= offset:
            return []
        try:
            fd = confined.open_read_fd(path)
        except FileNotFoundError:
            return []
        except OSError as e:
            self._refuse(path, st.st_ino, "unreadable", e)
            return []
        try:
            with open(fd, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if not header_sum:
                    raw = f.read(len(MAGIC) + _HEAD.size)
                    if len(raw) == len(MAGIC) + _HEAD.size and raw[: len(MAGIC)] == MAGIC:
                        _, nf, nw, ns = _HEAD.unpack_from(raw, len(MAGIC))
                        raw += f.read(min(nf + nw + ns + SUM_BYTES, MAX_HEADER_BYTES))  # the header, not beyond
                    self.bytes_read += len(raw)
                    head = parse_header(raw)
                    if head is None:
                        return []  # its header is being written
                    fp, vocab, writer, their_scope, header_sum, header_end = head
                    offset = max(offset, header_end)  # a segment followed from its end (``load``) stays there
                    expected = fingerprint_for(self.fingerprint, self._gens.get(scope) if scope else None)
                    if their_scope != scope or vocab != self.vocab_size or writer != segment_name(
                            os.path.basename(path))[0]:
                        raise BadSegment("misplaced", "its header names another scope, vocabulary or writer")
                    if fp != expected:
                        if fp.split(" purge:", 1)[0] == self.fingerprint:  # an older purge generation
                            self._unlink(path)
                            logger.info("freespec: suffix state_dir: %s removed: written before its scope was "
                                        "purged", path)
                            return []
                        raise BadSegment("foreign", f"written for tokenizer {fp[:80]!r}")
                # at most a round's share (and one whole record), or at start the most an honest writer's
                # segment holds (it compacts at twice the bounds): the rest at the next rounds
                share = self._segment_cap if budget is None else max(budget[0], _REC.size + 4 * self.max_tokens + 64)
                want = min(size - offset, share)
                f.seek(offset)
                data = f.read(want)
            self.bytes_read += len(data)
            if budget is not None:
                budget[0] -= len(data)
            records, used = parse_records(memoryview(data), header_sum, self.vocab_size, self.max_tokens,
                                          time.time_ns())
        except BadSegment as e:
            self._refuse(path, st.st_ino, e.kind, e)
            return []
        self._pos[path] = (ino, offset + used, header_sum)
        cutoff = int((now - self.max_age_s) * 1e9)
        got = [(scope, _digest(t), t, s) for t, s in records if s >= cutoff]
        purged = self.purges.latest
        if purged and got:
            gone = purged.drops(digests_of([g[1] for g in got]), [g[3] for g in got])
            got = [g for g, o in zip(got, gone.tolist()) if not o]
        return got

    def _refuse(self, path: str, ino: int, kind: str, e: BaseException) -> None:
        self.refused += 1
        self._bad[path] = ino
        self._pos.pop(path, None)
        self._log_once(kind, "a segment refused (%s: %s); skipped until it is replaced (logged once per kind)",
                       path, e)

    def _log_once(self, kind: str, message: str, *args) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            logger.warning("freespec: suffix state_dir: " + message, *args)


__all__ = ["FolderLog", "NOTHING", "read_segment", "segment_name"]
