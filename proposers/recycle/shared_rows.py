"""``recycle``'s matrix shared through Redis (``state_dir: redis://host:port/db``, issue 87).

The unit shared is one record: the rows of the matrix this replica changed since its last append (each a token id,
its top ``candidates`` successors and their probabilities, the row's stamp in Unix seconds), with the writer and
the record's time, appended once (``XADD``, ``MAXLEN ~ STREAM_MAXLEN``) to the namespace's stream
``freespec:v1:{<fp16>}:recycle:shared`` (``<fp16>``: a hash of the tokenizer's fingerprint, the vocabulary size and
``candidates``, so rows of another width never meet; ``shared``: the matrix learns from the shared scope only,
docs/security.md). The same Lua script folds the rows into the compacted snapshot, the hash
``...:recycle:shared:rows`` (token id -> its newest row, by ``matrix.merge_into``'s rule; at most ``vocab_size``
fields), so a starting replica catches up from the snapshot and then the stream's tail (``HSCAN``, then ``XREAD``
from the id it saw first), and a reader merges with the same rule: merging is idempotent and order-free.

Record fields: ``k`` ``rows``; ``c`` candidates; ``r`` the token ids (int32), ``i`` their candidates (int32
``[n, c]``), ``p`` the probabilities (float16 ``[n, c]``), ``m`` the rows' stamps (uint32), all little-endian;
``w`` the writer; ``s`` the record's time (ns). A record is checked when read and refused naming why (logged once
per kind): a missing field, another ``candidates``, lengths that disagree, more than ``RECORD_ROWS`` rows, a row
repeated or outside the vocabulary, a candidate outside it, a probability not in [0, 1], a stamp past now + 5 min.

Purges: a purge by writer, by age or in whole (``redis_stream.purge``) sets the namespace's cut
(``...:recycle:cut``, Unix seconds; it only rises) and appends a ``k: cut`` record; every row stamped at or before
it is purged: cleared from every replica's matrix when it reads the record, dropped from what it reads and
appends, removed from the snapshot. Rows carry no writer, so a purge by writer takes every writer's rows up to
its time, as the state directory's purges do (``proposers.learned.purges``). An append names the cut its writer
knows and the script refuses it when the cut moved since: a writer that has not seen a purge writes nothing back.

Faults (``redis_stream.RedisThread``): every Redis call runs on this thread ``freespec-redis-recycle``; the
engine's thread only hands over copies of changed rows and merges what was read (``put``/``take``: memory only).
Redis down, stalled or refusing writes (``maxmemory``): the matrix goes on learning locally, the rows wait (at
most one matrix's worth: newer rows replace older ones of the same token), each kind of failure is logged once,
and a reconnection reads the snapshot again. Redis restarted (another run id) or its keys gone: every row this
replica holds is appended again.

Bounds: rows waiting either way (``vocab_size`` after combining, on this thread), rows a record (``RECORD_ROWS``), records read a
call (``READ_COUNT``), rows merged a ``take`` (``TAKE_ROWS``); in Redis, the snapshot (``vocab_size`` rows of
``4 + 6 * candidates`` bytes) and the stream (``STREAM_MAXLEN`` records of at most ``RECORD_ROWS`` rows).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from freespec.proposers.learned.redis_stream import (
    BLOCK_MS,
    NAMESPACES,
    READ_COUNT,
    REFRESH_S,
    BadRecord,
    Keys,
    RedisThread,
    namespace,
    writer_and_stamp,
)
from freespec.proposers.learned.state_dir import CLOCK_SLACK_S
from freespec.proposers.recycle.matrix import Rows, newest_rows

logger = logging.getLogger("freespec")

SHARE_EVERY_S = 1.0  # the engine's thread hands over the rows it changed at most this often
RECORD_ROWS = 256  # rows a record: about 16 KB in Redis at 8 candidates
STREAM_MAXLEN = 1000  # records a stream keeps; older ones are in the snapshot
TAKE_ROWS = 16_384  # rows the engine's thread merges per ``take`` (the rest wait for the next): about a ms
SCAN_COUNT = 1000  # snapshot rows a page at start

# Append one record of rows and fold them into the snapshot, unless the purge cut moved since the writer last
# looked: KEYS stream, snapshot, cut, namespaces; ARGV the cut the writer knows ('0' none), maxlen, namespace,
# candidates, rows, ids, probs, stamps, writer, time. Returns the current cut when it refuses, else ''.
_APPEND_ROWS = """
local cut = redis.call('GET', KEYS[3]) or '0'
if cut ~= ARGV[1] then return cut end
local r, i, p, m = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local c = tonumber(ARGV[4])
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'k', 'rows', 'c', ARGV[4], 'r', r, 'i', i, 'p', p, 'm', m,
           'w', ARGV[9], 's', ARGV[10])
for j = 0, #r / 4 - 1 do
  local row, stamp = string.sub(r, 4 * j + 1, 4 * j + 4), string.sub(m, 4 * j + 1, 4 * j + 4)
  local old = redis.call('HGET', KEYS[2], row)
  if (not old) or struct.unpack('<I4', old) < struct.unpack('<I4', stamp) then
    redis.call('HSET', KEYS[2], row, stamp .. string.sub(i, 4 * c * j + 1, 4 * c * (j + 1))
               .. string.sub(p, 2 * c * j + 1, 2 * c * (j + 1)))
  end
end
redis.call('SADD', KEYS[4], ARGV[3])
return ''
"""


@dataclass
class Taken:
    """What the fleet brought since the last ``take``: the purge cut to clear up to (0: none), rows to merge (each
    part's token ids unique; merged one part after another, the newest row wins as if combined first), and
    whether every row held should be shared again (Redis lost them)."""

    cut: int = 0
    parts: list[Rows] = field(default_factory=list)
    reshare: bool = False


def check_rows(fields: dict, *, vocab_size: int, candidates: int, now_ns: int) -> tuple[Rows, str]:
    """A ``rows`` record's rows and writer, checked; ``BadRecord`` naming why otherwise."""
    need = (b"c", b"r", b"i", b"p", b"m", b"w", b"s")
    if any(fields.get(k) is None for k in need):
        raise BadRecord("missing field", f"fields {sorted(k.decode('ascii', 'replace') for k in fields)[:12]}, "
                                         "needs c, r, i, p, m, w and s")
    c, r, i, p, m = (fields[k] for k in need[:5])
    if c != str(candidates).encode():
        raise BadRecord("other candidates", f"rows of {c[:8]!r} candidates, this server keeps {candidates}")
    n = len(r) // 4
    if not r or len(r) % 4 or len(i) != 4 * n * candidates or len(p) != 2 * n * candidates or len(m) != 4 * n:
        raise BadRecord("bad length", f"{len(r)}, {len(i)}, {len(p)} and {len(m)} bytes of rows, candidates, "
                                      f"probabilities and stamps do not make whole rows of {candidates}")
    if n > RECORD_ROWS:
        raise BadRecord("too many rows", f"{n} rows, more than {RECORD_ROWS} a record")
    writer, _ = writer_and_stamp(fields[b"w"], fields[b"s"], now_ns)
    rows = np.frombuffer(r, dtype="<i4").astype(np.int64)
    if int(rows.min()) < 0 or int(rows.max()) >= vocab_size:
        raise BadRecord("row out of vocabulary", f"rows in [{rows.min()}, {rows.max()}], the vocabulary is "
                                                 f"[0, {vocab_size})")
    if len(np.unique(rows)) != n:
        raise BadRecord("repeated row", "a token's row twice in one record")
    out = Rows(rows, np.frombuffer(i, dtype="<i4").astype(np.int32).reshape(n, candidates),
               np.frombuffer(p, dtype="<f2").astype(np.float16).reshape(n, candidates),
               np.frombuffer(m, dtype="<u4").astype(np.uint32))
    _check_values(out, vocab_size, now_ns)
    return out, writer


def _check_values(rows: Rows, vocab_size: int, now_ns: int) -> None:
    if int(rows.ids.min()) < -1 or int(rows.ids.max()) >= vocab_size:
        raise BadRecord("token out of vocabulary", f"candidates in [{rows.ids.min()}, {rows.ids.max()}], the "
                                                   f"vocabulary is [0, {vocab_size})")
    probs = rows.probs.astype(np.float32)
    if not (np.isfinite(probs).all() and probs.min() >= 0 and probs.max() <= 1):
        raise BadRecord("bad probability", "a probability that is NaN, infinite or outside [0, 1]")
    ahead = now_ns // 1_000_000_000 + int(CLOCK_SLACK_S)
    if int(rows.stamps.min()) == 0 or int(rows.stamps.max()) > ahead:
        raise BadRecord("bad stamp", "a row stamp of 0 or past now + 5 min (it would win every merge)")


def snapshot_rows(page: dict, *, vocab_size: int, candidates: int, now_ns: int) -> tuple[Rows | None, int]:
    """A page of the snapshot hash (token id -> stamp, candidates, probabilities) as rows, and how many of its
    entries were refused (a wrong size, a row outside the vocabulary; a page with a bad value is refused whole)."""
    width = 4 + 6 * candidates
    good = [(k, v) for k, v in page.items() if len(k) == 4 and len(v) == width]
    bad = len(page) - len(good)
    if not good:
        return None, bad
    rows = np.frombuffer(b"".join(k for k, _ in good), dtype="<i4").astype(np.int64)
    blob = np.frombuffer(b"".join(v for _, v in good), dtype=np.uint8).reshape(len(good), width)
    inside = (rows >= 0) & (rows < vocab_size)
    bad += int((~inside).sum())
    blob, rows = blob[inside], rows[inside]
    if not len(rows):
        return None, bad
    out = Rows(rows, np.ascontiguousarray(blob[:, 4: 4 + 4 * candidates]).view("<i4").astype(np.int32),
               np.ascontiguousarray(blob[:, 4 + 4 * candidates:]).view("<f2").astype(np.float16),
               np.ascontiguousarray(blob[:, :4]).view("<u4").reshape(-1).astype(np.uint32))
    try:
        _check_values(out, vocab_size, now_ns)
    except BadRecord:
        return None, bad + len(rows)
    return out, bad


class SharedRows(RedisThread):
    """``recycle``'s Redis backend (see the module docstring): ``put``/``take``/``close`` on the engine's thread,
    every Redis call on its own thread."""

    what = "recycle learned state"

    def __init__(self, url: str, *, fingerprint: str, vocab_size: int, candidates: int, writer: str | None = None,
                 block_ms: int = BLOCK_MS, refresh_s: float = REFRESH_S) -> None:
        from freespec.proposers.learned.state_dir import writer_id

        super().__init__(url, "freespec-redis-recycle")
        self.vocab_size, self.candidates = vocab_size, candidates
        self.keys = Keys(namespace(fingerprint, vocab_size, candidates), "recycle")
        self.writer = writer or writer_id()
        self.block_ms, self.refresh_s = block_ms, refresh_s
        self._lock = threading.Lock()  # _out, _in, cut, _reshare: shared by the two threads
        self._out: list[Rows] = []  # rows handed over, not appended yet
        self._in: list[Rows] = []  # rows read, not merged yet
        self.cut = 0  # the highest purge cut seen (Unix seconds)
        self._known_cut = b"0"  # the cut key's value as last read (the append script compares it)
        self._reshare = False
        self._busy = False  # appending what ``_flush`` took
        self._existed = False  # this replica saw or wrote the stream (gone: Redis restarted empty)
        self._run_id: str | None = None  # the server's, as last seen
        self._last = b"0-0"
        self._refreshed = 0.0
        self._script = None
        self.appended = self.applied = self.refused = 0  # rows appended and merged, records refused
        self._start()

    # ---------------------------------------------------------------- the engine's thread: memory only
    def ready(self) -> bool:
        """Whether rows handed over now would be appended next: nothing waits. While something does (Redis slow or
        down), the engine keeps its changed rows marked instead, so nothing here grows and its thread never
        combines what waits."""
        return not self._out

    def put(self, rows: Rows) -> None:
        """Rows this replica changed (copies), to append."""
        if len(rows):
            with self._lock:
                self._out = _bounded(self._out + [rows], self.vocab_size)

    def take(self) -> Taken:
        with self._lock:
            parts, n = [], 0
            while self._in and n < TAKE_ROWS:
                parts.append(self._in.pop(0))
                n += len(parts[-1])
            out = Taken(self.cut, parts, self._reshare)
            self._reshare = False
        self.applied += n
        return out

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Tests: until nothing waits to be appended (True), or ``timeout``."""
        deadline = time.monotonic() + timeout
        while (self._out or self._busy) and time.monotonic() < deadline:
            time.sleep(0.01)
        return not (self._out or self._busy)

    # ---------------------------------------------------------------- the Redis thread
    def _connected(self, client) -> None:
        self._script = client.register_script(_APPEND_ROWS)

    def _at_exit(self) -> None:
        try:
            self._flush()
        except Exception as e:  # noqa: BLE001
            if self._out:
                logger.warning("freespec: recycle learned state: %d row(s) not appended to Redis %s at exit (%s)",
                               sum(len(r) for r in self._out), self.where, type(e).__name__)

    def _round(self) -> None:
        import redis

        c = self._redis()
        if not self._primed:
            self._prime(c)
            self._primed = True
        try:
            self._flush()
        except redis.ResponseError as e:  # a server refusing writes (maxmemory) still serves reads
            self._fault(e)
        if time.monotonic() - self._refreshed >= self.refresh_s:
            self._refreshed = time.monotonic()
            if self._existed and not c.exists(self.keys.stream(""), self.keys.rows):
                # Redis restarted empty (or its keys were deleted): share again all this replica holds, and read
                # the cut again (it restarted at none)
                logger.info("freespec: recycle learned state: the stream was gone from Redis %s; this replica's "
                            "rows are appended again", self.where)
                with self._lock:
                    self._reshare = True
                self._existed = False
                self._primed = False
                return
        for _, entries in c.xread({self.keys.stream(""): self._last}, count=READ_COUNT, block=self.block_ms) or ():
            for entry_id, fields in entries:
                self._record(fields)
                self._last = entry_id
            self._existed = True

    def _prime(self, c) -> None:
        """Catch up: the cut, then the snapshot, then (``_round``) the stream from its newest id seen first. A
        server that restarted (another run id) may have lost the rows: this replica shares all it holds again
        (another replica's first append must not hide the loss, so the keys' absence alone is not the test)."""
        import redis

        try:
            run_id = c.info("server").get("run_id")
        except redis.ResponseError:  # INFO denied by an ACL: the keys' absence is then the test
            run_id = self._run_id
        if run_id is not None and self._run_id is not None and run_id != self._run_id and self._existed:
            logger.info("freespec: recycle learned state: Redis %s restarted; this replica's rows are appended "
                        "again", self.where)
            with self._lock:
                self._reshare = True
        self._run_id = run_id
        self._cut_read(c.get(self.keys.cut) or b"0")
        newest = c.xrevrange(self.keys.stream(""), count=1)
        self._last = newest[0][0] if newest else b"0-0"
        self._existed = self._existed or bool(newest)
        if c.hlen(self.keys.rows) > self.vocab_size:
            self._log_once("snapshot too large", "the snapshot in Redis %s holds more rows than the vocabulary "
                           "(%d); only that many are read", self.where, self.vocab_size)
        cursor, seen, refused = 0, 0, 0
        while True:
            cursor, page = c.hscan(self.keys.rows, cursor, count=SCAN_COUNT)
            rows, bad = snapshot_rows(page, vocab_size=self.vocab_size, candidates=self.candidates,
                                      now_ns=time.time_ns())
            refused += bad
            if rows is not None:
                self._incoming(rows)
            seen += len(page)
            if not cursor or seen >= self.vocab_size:
                break
        if refused:
            self.refused += refused
            self._log_once("bad snapshot row", "%d row(s) of the snapshot in Redis %s refused (a wrong size, a row "
                           "or candidate outside the vocabulary, a bad probability or stamp); skipped", refused,
                           self.where)

    def _flush(self) -> None:
        """Append what waits, a record of at most ``RECORD_ROWS`` rows at a time, unless a purge moved the cut."""

        with self._lock:
            waiting, self._out = self._out, []
            self._busy = bool(waiting)
        if not waiting:
            return
        try:
            self._append(waiting)
        finally:
            self._busy = False

    def _append(self, waiting: list[Rows]) -> None:
        import redis

        rows = newest_rows(waiting)
        rows = rows.keep(rows.stamps > self.cut)
        keys = [self.keys.stream(""), self.keys.rows, self.keys.cut, NAMESPACES]
        done = 0
        try:
            while done < len(rows):
                part = rows.keep(slice(done, done + RECORD_ROWS))
                now = self._script(keys=keys, args=[
                    self._known_cut, STREAM_MAXLEN, self.keys.ns, self.candidates,
                    part.rows.astype("<i4").tobytes(), part.ids.astype("<i4").tobytes(),
                    part.probs.astype("<f2").tobytes(), part.stamps.astype("<u4").tobytes(), self.writer,
                    str(time.time_ns())])
                if now:  # a purge since this replica last looked: nothing it removed is written back
                    self._cut_read(now)
                    rest = rows.keep(slice(done, None))
                    self.put(rest.keep(rest.stamps > self.cut))
                    return
                done += len(part)
                self.appended += len(part)
                self._existed = True
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError, OSError):
            self.put(rows.keep(slice(done, None)))  # tried again; newer rows of a token replace these
            raise

    def _record(self, fields: dict) -> None:
        kind = fields.get(b"k")
        if kind == b"cut":
            b = fields.get(b"b", b"")
            if b.isdigit() and len(b) <= 12:
                self._set_cut(int(b))
            else:
                self._log_once("bad cut", "a purge record in Redis %s skipped (damaged)", self.where)
            return
        try:
            if kind != b"rows":
                raise BadRecord("unknown kind", f"'k' is {(kind or b'')[:16]!r}, not rows or cut")
            rows, writer = check_rows(fields, vocab_size=self.vocab_size, candidates=self.candidates,
                                      now_ns=time.time_ns())
        except BadRecord as e:
            self.refused += 1
            self._log_once(e.kind, "a record of Redis %s refused (%s); skipped (logged once per kind)", self.where, e)
            return
        if writer != self.writer:
            self._incoming(rows)

    def _incoming(self, rows: Rows) -> None:
        with self._lock:
            rows = rows.keep(rows.stamps > self.cut)
            if len(rows):
                self._in = _bounded(self._in + [rows], self.vocab_size)

    def _cut_read(self, value: bytes) -> None:
        self._known_cut = value
        if value.isdigit() and len(value) <= 12:
            self._set_cut(int(value))

    def _set_cut(self, cut: int) -> None:
        with self._lock:
            if cut <= self.cut:
                return
            self.cut = cut
            self._in = [r.keep(r.stamps > cut) for r in self._in]
            self._out = [r.keep(r.stamps > cut) for r in self._out]


def _bounded(parts: list[Rows], vocab_size: int) -> list[Rows]:
    """``parts``, combined into one (the newest row of each token) once they hold more than ``vocab_size`` rows:
    what waits never exceeds two matrices' worth."""
    if sum(len(p) for p in parts) <= vocab_size:
        return parts
    return [newest_rows(parts)]


__all__ = ["RECORD_ROWS", "SHARE_EVERY_S", "SharedRows", "Taken", "check_rows"]
