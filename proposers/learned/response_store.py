"""Past responses kept across restarts and replicas: a bounded store of token sequences, persisted atomically.

Why: the responses a server has produced are the best corpus for its next ones (REST, He et al., 2024;
SuffixDecoding keeps its recent responses for the same reason), but a cache in memory is lost at restart
and each replica learns alone. A drafting source loads the store at start, adds every finished response,
saves it now and then in the background and merges its replicas' files, as ``recycle`` does with its matrix.

Bounds: at most ``max_responses`` responses and ``max_tokens`` tokens (a longer response keeps its first
``max_tokens``); adding beyond either evicts the oldest. A response added again moves to the newest. Memory:
4 bytes per token plus at most ``ENTRY_OVERHEAD_BYTES`` per response (``max_bytes()``); a save in progress
keeps the responses it writes alive, so at most twice that while one runs; a peer's file being read or
waiting to be merged adds at most one more store (read straight into its responses' buffers). Disk: ``file_bytes()`` (4 bytes per token, 12 per response, a header of at most
``HEADER_BYTES + MAX_FINGERPRINT_BYTES`` and a 32-byte checksum).

File format (version 1, little-endian, no pickle): a 64-byte header (``MAGIC``, version, fingerprint
length, vocabulary size, a reserved zero, response count, token count, the horizon's stamp and digest), the
caller's tokenizer fingerprint (UTF-8), the responses' lengths (uint32) and stamps (int64, nanoseconds since
the epoch by the clock of the server that added them), their tokens (int32, concatenated, oldest response first), then the SHA-256
of everything before it. A file that is corrupt, truncated, of another tokenizer or vocabulary, or larger
than this store's bounds is refused with ``ResponseStoreError`` before anything beyond its header is read;
so is anything but a regular file (a FIFO is never waited on), and a file whose stamps or horizon lie more
than ``MAX_CLOCK_AHEAD_NS`` past this server's clock (it would win every merge, erase this replica's
responses, or push its next stamps to overflow), or that has a horizon and no responses (a store holding
none is written without its horizon).

Saving writes a temporary file next to the target (created with mode 0666, so the umask applies as to any
new file), fsyncs it and renames it over the target, so a crash leaves the old file or the new one, never
half of one. A temporary file a crash left behind is removed by the next ``load`` (when the process that
wrote it is gone), so crashes do not add up on disk.

Merge rule (replicas): the union of both stores, one copy of each distinct response (the newest stamp),
less what either side has evicted (its horizon: the newest response it dropped), then the newest responses
that fit the bounds. It is commutative, associative and idempotent, so a replica may merge a file that
already holds its own responses, and files may be merged in any order or grouping.

Threads: ``add``, ``save_async``, ``merge_async`` and ``take_merged`` do no file I/O and hold a lock only
for in-memory work; writing, reading peers' files and merging them happen in one background thread with one
slot for the next save (a newer request replaces an older one) and one for a peer store read, checked and
merged (the thread waits until it is taken); ``take_merged`` applies it. ``load``, ``merge_from`` (at start) and ``close`` (at exit) do their I/O in the
caller's thread. A failed save is logged once per distinct error and never raised.
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import secrets
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from freespec import confined
from freespec.proposers.learned.file_worker import FileWorker, error_kind
from freespec.proposers.learned.purges import Purged, digests_of
from freespec.proposers.learned.state_dir import CLOCK_SLACK_NS
from freespec.safe_files import clip, open_lock_file, open_regular, process_alive, short

logger = logging.getLogger("freespec")

MAGIC = b"\x89FSRESP\n"  # a non-ASCII first byte and a newline: a file mangled as text does not match
VERSION = 1
# magic, version, fingerprint bytes, vocab size, reserved, count, tokens, horizon (stamp, digest)
_HEADER = struct.Struct("<8sIIIIQQq16s")
HEADER_BYTES = _HEADER.size
MAX_FINGERPRINT_BYTES = 1024
CHECKSUM_BYTES = 32
# The most the options may ask for (the file's fields are uint64, but one store is meant for one server's
# recent traffic): 1,048,576 responses and 268,435,456 tokens (1 GiB of token ids).
MAX_RESPONSES = 1 << 20
MAX_TOKENS = 1 << 28
# Memory per response beyond its tokens: the numpy array and its buffer, the digest (twice: key and entry),
# the entry, its stamp and the ordered dict's node. tracemalloc measured 440 to 610 bytes per response
# (100 to 50,000 responses of 2 tokens); test_memory_stays_within_the_stated_bound checks the bound.
ENTRY_OVERHEAD_BYTES = 700

_DIGEST_BYTES = 16
FIND_PEERS = "\0find-peers"  # asked of merge_async: the peers find_peers lists, in the background
# A stamp (or horizon) in a file may be at most this far ahead of this server's clock: a peer's file that
# says later would win every merge and, as a horizon, erase every response of this replica; near 2**63 the
# next stamp overflows and no save is written again. Such a file is refused (``CORRUPT``).
MAX_CLOCK_AHEAD_NS = CLOCK_SLACK_NS  # the one skew allowed between replicas (``state_dir``)


class ResponseStoreError(ValueError):
    """A store file that must not be used; ``path`` and ``reason`` say which and why (also in the message)."""

    def __init__(self, path: str, reason: str, detail: str) -> None:
        super().__init__(f"response store {path!r}: {reason}: {detail}")
        self.path, self.reason, self.detail = path, reason, detail


# ``ResponseStoreError.reason``: one of these.
UNREADABLE, NOT_A_STORE, UNSUPPORTED, FOREIGN, OVERSIZE, TRUNCATED, CORRUPT = (
    "unreadable", "not a response store", "unsupported version", "foreign", "oversize", "truncated", "corrupt",
)


@dataclass(frozen=True, slots=True)
class _Entry:
    stamp: int
    digest: bytes
    tokens: np.ndarray  # int32, read-only

    @property
    def key(self) -> tuple[int, bytes]:
        """The merge order: by stamp, ties broken by content, so every replica orders alike."""
        return (self.stamp, self.digest)


NO_HORIZON = (0, b"")


@dataclass(frozen=True)
class Stored:
    """A store's content: its entries, oldest first, and its horizon, the newest key it has evicted (every
    entry is newer). A merge drops what is not newer than either side's horizon: a response one replica
    evicted does not come back from another's older file, which keeps the merge associative."""

    entries: Sequence[_Entry]
    horizon: tuple[int, bytes] = NO_HORIZON


def _digest(tokens: np.ndarray) -> bytes:
    return hashlib.blake2b(memoryview(tokens).cast("B"), digest_size=_DIGEST_BYTES).digest()


def _frozen(tokens: np.ndarray) -> np.ndarray:
    tokens.flags.writeable = False
    return tokens


def file_bytes(responses: int, tokens: int, fingerprint: str) -> int:
    """The exact size of a store file holding ``responses`` responses of ``tokens`` tokens in all."""
    return HEADER_BYTES + len(fingerprint.encode()) + 12 * responses + 4 * tokens + CHECKSUM_BYTES


def write_store(path: str, stored: Stored, *, fingerprint: str, vocab_size: int, perms: int = 0o666) -> None:
    """Write ``stored`` to ``path`` atomically: temporary file, fsync, rename, fsync the folder.

    On any error the temporary file is removed and the old file (if any) is left as it was.
    """
    fp = fingerprint.encode()
    tmp = f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp"

    def fill(f) -> None:
        h = hashlib.sha256()

        def put(data) -> None:
            h.update(data)
            f.write(data)

        entries = stored.entries
        total = sum(len(e.tokens) for e in entries)
        # A store that evicted its every response (``evict_oldest``) is written as an empty one: a horizon
        # with no responses is what ``read_store`` refuses (such a file would only erase a peer's).
        stamp, digest = stored.horizon if entries else NO_HORIZON
        put(_HEADER.pack(MAGIC, VERSION, len(fp), vocab_size, 0, len(entries), total, stamp, digest))
        put(fp)
        put(np.fromiter((len(e.tokens) for e in entries), dtype="<u4", count=len(entries)).tobytes())
        put(np.fromiter((e.stamp for e in entries), dtype="<i8", count=len(entries)).tobytes())
        for e in entries:
            put(memoryview(e.tokens.astype("<i4", copy=False)).cast("B"))
        f.write(h.digest())

    # 0666 and not mkstemp's 0600: the umask applies as to any new file (0644 under 022), so a replica
    # running as another user can read it. O_EXCL | O_NOFOLLOW, and in a state directory no link followed
    # on the way (``freespec.confined``).
    confined.write_atomic(path, tmp, fill, perms)


def read_store(
    path: str, *, fingerprint: str, vocab_size: int, max_responses: int, max_tokens: int
) -> Stored:
    """Read a store file and check it whole; any doubt raises ``ResponseStoreError`` naming the reason.

    The header is checked (magic, version, fingerprint, vocabulary size, counts against the bounds, the
    file's exact size) before anything else is read or allocated; then the lengths (they must add up to the
    token count), the token ids (in ``[0, vocab_size)``), the order of the stamps and the checksum.
    """

    def refuse(reason: str, detail: str) -> ResponseStoreError:
        return ResponseStoreError(path, reason, detail)

    try:
        with open_regular(path, "rb") as f:  # a FIFO or device is refused, never waited on
            size = os.fstat(f.fileno()).st_size
            head = f.read(HEADER_BYTES)
            if head[: len(MAGIC)] != MAGIC[: len(head)]:
                raise refuse(NOT_A_STORE, "its first bytes are not a freespec response store's")
            if len(head) < HEADER_BYTES:
                raise refuse(TRUNCATED, f"{size} bytes, shorter than the {HEADER_BYTES}-byte header")
            _, version, fp_len, vocab, reserved, count, total, h_stamp, h_digest = _HEADER.unpack(head)
            if version != VERSION:
                raise refuse(UNSUPPORTED, f"format version {version}, this freespec reads version {VERSION}")
            if fp_len > MAX_FINGERPRINT_BYTES or reserved != 0:
                raise refuse(CORRUPT, f"header fields out of range (fingerprint of {fp_len} bytes, reserved {reserved})")
            fp = f.read(fp_len)
            if len(fp) < fp_len:
                raise refuse(TRUNCATED, f"{size} bytes, shorter than its header")
            theirs = fp.decode("utf-8", "replace")
            if theirs != fingerprint:
                raise refuse(FOREIGN, f"written for tokenizer {short(theirs)}, this server's is {fingerprint!r}")
            latest = time.time_ns() + MAX_CLOCK_AHEAD_NS
            if not 0 <= h_stamp <= latest:
                raise refuse(CORRUPT, f"header field 'horizon' is {h_stamp} ns, outside [0, now + "
                                      f"{MAX_CLOCK_AHEAD_NS // 10**9} s]: it would erase this replica's responses")
            if count == 0 and (h_stamp, h_digest) != (0, bytes(_DIGEST_BYTES)):
                raise refuse(CORRUPT, "header field 'horizon' set in a file with no responses (a store that "
                                      "evicted keeps at least its newest response)")
            if vocab != vocab_size:
                raise refuse(FOREIGN, f"written for a vocabulary of {vocab} tokens, this server's has {vocab_size}")
            if count > max_responses or total > max_tokens:
                raise refuse(OVERSIZE, f"holds {count} responses of {total} tokens, more than this store's "
                                       f"max_responses {max_responses} / max_tokens {max_tokens} (written with "
                                       "larger bounds: raise them, or remove the file)")
            expected = file_bytes(count, total, fingerprint)
            if size < expected:
                raise refuse(TRUNCATED, f"{size} bytes, its header says {expected}")
            if size > expected:
                raise refuse(CORRUPT, f"{size} bytes, its header says {expected}")
            h = hashlib.sha256(head)
            h.update(fp)
            lengths = _read_array(f, h, "<u4", count)
            if count and (int(lengths.min()) < 1 or int(lengths.sum(dtype=np.uint64)) != total):
                raise refuse(CORRUPT, "response lengths do not add up to the token count")
            stamps = _read_array(f, h, "<i8", count)
            if count and not (int(stamps.min()) >= 1 and int(stamps.max()) <= latest):
                raise refuse(CORRUPT, f"field 'stamps' holds {int(stamps.max())} ns, outside [1, now + "
                                      f"{MAX_CLOCK_AHEAD_NS // 10**9} s]: it would win every merge")
            horizon = (h_stamp, h_digest) if (h_stamp, h_digest) != (0, bytes(_DIGEST_BYTES)) else NO_HORIZON
            out: list[_Entry] = []
            for n, stamp in zip(lengths.tolist(), stamps.tolist()):
                # Each response in its own buffer (evicting it frees it), read straight into it: reading
                # takes the file's token bytes once.
                piece = _frozen(_read_array(f, h, "<i4", n).astype(np.int32, copy=False))
                if int(piece.min()) < 0 or int(piece.max()) >= vocab_size:
                    raise refuse(CORRUPT, f"token ids outside the vocabulary [0, {vocab_size})")
                out.append(_Entry(int(stamp), _digest(piece), piece))
                if out[-1].key <= (out[-2].key if len(out) > 1 else horizon):
                    raise refuse(CORRUPT, "responses are not in order (by stamp and content, all newer than "
                                          "its horizon)")
            if f.read(CHECKSUM_BYTES) != h.digest():
                raise refuse(CORRUPT, "checksum mismatch (the file was modified or damaged)")
    except ResponseStoreError:
        raise
    except (OSError, EOFError, ValueError) as e:  # EOFError/ValueError: the file shrank while being read
        raise refuse(UNREADABLE, f"{type(e).__name__}: {clip(str(e))}") from e
    return Stored(out, horizon)


def read_fingerprint(path: str) -> str | None:
    """The tokenizer fingerprint a store file was written for (its header only); None if it is not a store."""
    try:
        with open_regular(path, "rb") as f:
            head = f.read(HEADER_BYTES)
            if len(head) < HEADER_BYTES or head[: len(MAGIC)] != MAGIC:
                return None
            fp_len = _HEADER.unpack(head)[2]
            if fp_len > MAX_FINGERPRINT_BYTES:
                return None
            return f.read(fp_len).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None


def read_any(path: str) -> Stored:
    """A store file read and checked whole for whatever tokenizer and vocabulary its header names (tools: a
    purge records what a file held); ``ResponseStoreError`` as ``read_store``."""
    try:
        with open_regular(path, "rb") as f:
            head = f.read(HEADER_BYTES)
    except OSError as e:
        raise ResponseStoreError(path, UNREADABLE, f"{type(e).__name__}: {clip(str(e))}") from e
    if len(head) < HEADER_BYTES or head[: len(MAGIC)] != MAGIC:
        raise ResponseStoreError(path, NOT_A_STORE, "its first bytes are not a freespec response store's")
    vocab = _HEADER.unpack(head)[3]
    fingerprint = read_fingerprint(path)
    if fingerprint is None or not 1 <= vocab < 1 << 31:
        raise ResponseStoreError(path, CORRUPT, "header fields out of range")
    return read_store(path, fingerprint=fingerprint, vocab_size=vocab, max_responses=MAX_RESPONSES,
                      max_tokens=MAX_TOKENS)


def _read_array(f, h, dtype: str, n: int) -> np.ndarray:
    """``n`` values of ``dtype`` read from ``f`` into a new array, fed to the checksum ``h``."""
    out = np.empty(n, dtype=dtype)
    view = memoryview(out).cast("B")
    done = 0
    while done < len(view):
        got = f.readinto(view[done:])
        if not got:
            raise EOFError(f"ended after {done} of {len(view)} bytes of an array")
        done += got
    h.update(view)
    return out


def merge(a: Stored, b: Stored, max_responses: int, max_tokens: int) -> Stored:
    """The merge rule: one copy of each distinct response (its newest stamp), newer than both horizons, then
    the newest that fit the bounds (the first that does not becomes the horizon), oldest first.

    Commutative, associative and idempotent (a store merged with itself, or with a file it already merged,
    is unchanged): ordered by ``_Entry.key``, the result does not depend on which side is which.
    """
    horizon = max(a.horizon, b.horizon)
    best: dict[bytes, _Entry] = {}
    for e in (*a.entries, *b.entries):
        seen = best.get(e.digest)
        if seen is None or e.stamp > seen.stamp:
            best[e.digest] = e
    newest_first = sorted((e for e in best.values() if e.key > horizon), key=lambda e: e.key, reverse=True)
    kept: list[_Entry] = []
    tokens = 0
    for e in newest_first:
        if len(kept) == max_responses or tokens + len(e.tokens) > max_tokens:
            horizon = e.key  # what does not fit, and everything older, is dropped
            break
        kept.append(e)
        tokens += len(e.tokens)
    kept.reverse()
    return Stored(kept, horizon)


@dataclass
class _Merged:
    """A merge prepared against a snapshot of the store (``ResponseStore._prepare``), to be applied."""

    entries: OrderedDict  # digest -> _Entry, oldest first
    tokens: int
    horizon: tuple[int, bytes]
    base_last: tuple[int, bytes]  # the snapshot's newest key: entries newer than it were added since
    added: list[_Entry]  # entries the snapshot did not hold


_claimed: dict[str, int] = {}  # real path -> the descriptor of its lock file, held for the process's life


def claim_file(path: str) -> None:
    """Make this process the one writer of the store file ``path`` (an exclusive ``flock`` on ``.NAME.lock``
    beside it, held until exit): two processes given one ``responses_path`` (two data-parallel engine cores
    with one config) would each overwrite the other's saves. The second is refused, naming the file."""
    real = os.path.realpath(path)
    if real in _claimed:
        return
    directory, name = os.path.split(real)
    fd = open_lock_file(os.path.join(directory, f".{name}.lock"))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ValueError(f"{path!r} is written by another running process (an engine core or replica given the "
                         "same responses_path): each would overwrite the other's saves. Give each process its own "
                         "file, or use the option state_dir, where every process keeps its own file and merges "
                         "the others'") from None
    except OSError:
        os.close(fd)  # a filesystem without locks: as before, unguarded
        return
    _claimed[real] = fd


class ResponseStore:
    """Past responses (token id arrays), bounded by ``max_responses`` and ``max_tokens``, saved to ``path``.

    ``fingerprint`` names the tokenizer (``freespec.proposers.vocab.vocab_fingerprint``) and ``vocab_size``
    the vocabulary; a file written for others is refused. Memory: at most ``max_bytes()`` bytes (4 per
    token, ``ENTRY_OVERHEAD_BYTES`` per response), as much again while a save runs and while a peer's file
    is read and merged; disk: ``max_file_bytes()``. At the defaults (10,000 responses, 2,000,000 tokens):
    15 MB in memory (45 MB at most with a save and a merge under way), 8.1 MB on disk. The caller registers ``close`` to run at exit (and on SIGTERM), as ``recycle`` does.
    """

    def __init__(
        self, path: str, *, fingerprint: str, vocab_size: int, max_responses: int = 10_000,
        max_tokens: int = 2_000_000, perms: int = 0o666, check_folder: bool = True,
        find_peers: Callable[[], Sequence[str]] | None = None, purged: Callable[[], Purged] | None = None,
    ) -> None:
        if not 1 <= max_responses <= MAX_RESPONSES:
            raise ValueError(f"max_responses must be in [1, {MAX_RESPONSES}], got {max_responses}")
        if not 1 <= max_tokens <= MAX_TOKENS:
            raise ValueError(f"max_tokens must be in [1, {MAX_TOKENS}], got {max_tokens}")
        if len(fingerprint.encode()) > MAX_FINGERPRINT_BYTES:
            raise ValueError(f"fingerprint longer than {MAX_FINGERPRINT_BYTES} bytes")
        if not 1 <= vocab_size < 1 << 31:
            raise ValueError(f"vocab_size must be in [1, 2**31), got {vocab_size}")
        directory = os.path.dirname(os.path.abspath(path))
        if check_folder and not os.path.isdir(directory):  # the file may not exist yet (first start); its folder must
            raise ValueError(f"response store {path!r}: directory {directory!r} does not exist")
        self.path, self.fingerprint, self.vocab_size = path, fingerprint, vocab_size
        self.perms = perms  # of the files it creates (a state directory's: 0600)
        self.find_peers = find_peers  # lists the peers' files (a state directory's), in the background thread
        self.purged = purged  # what purges removed (``proposers.learned.purges``): never merged, loaded or saved again
        self.max_responses, self.max_tokens = max_responses, max_tokens
        self._lock = threading.Lock()  # in-memory state only; never held during file I/O
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()  # digest -> entry, oldest first
        self._tokens = 0
        self._horizon = NO_HORIZON  # the newest key evicted (``Stored``)
        self._last_stamp = 0
        self._write_lock = threading.Lock()  # one writer of ``path`` at a time (thread or close)
        self._save_error: str | None = None
        self._files: FileWorker | None = None
        self._peer_seen: dict = {}  # peer path -> (mtime_ns, size) last merged
        self._peer_errors: dict = {}  # peer path -> the last error logged for it
        self._closed = False
        self.saves = 0  # successful saves (tests, statistics)
        # Changes to the content (adds, evictions, merges) and the count the last save asked for: a store
        # that did not change is not written again (an idle server writes nothing, and its peers, which
        # re-read a file whose mtime moved, read nothing); a failed save asks again (-1).
        self._changes = 0
        self._save_asked = -1

    # ---------------------------------------------------------------- bounds
    def max_bytes(self) -> int:
        """The most memory the responses may take (a save in progress may keep as much again alive)."""
        return 4 * self.max_tokens + ENTRY_OVERHEAD_BYTES * self.max_responses

    def max_file_bytes(self) -> int:
        """The largest file this store writes or accepts."""
        return file_bytes(self.max_responses, self.max_tokens, self.fingerprint)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def num_tokens(self) -> int:
        return self._tokens

    def responses(self) -> list[np.ndarray]:
        """The stored responses (read-only int32 arrays), oldest first."""
        with self._lock:
            return [e.tokens for e in self._entries.values()]

    # ---------------------------------------------------------------- in memory (any thread, no I/O)
    def add(self, tokens: Sequence[int] | np.ndarray) -> bool:
        """Keep a finished response (copied); evicts the oldest beyond the bounds. No file I/O.

        Work: one copy and one hash of the response, amortised O(1) dictionary work. Returns False for an
        empty response (nothing kept); raises ``ValueError`` for ids outside ``[0, vocab_size)``.
        """
        src = np.asarray(tokens[: self.max_tokens])
        if src.ndim != 1:
            raise ValueError(f"a response is a 1-D sequence of token ids, got shape {src.shape}")
        if src.size == 0:
            return False
        if src.dtype.kind not in "iu" or int(src.min()) < 0 or int(src.max()) >= self.vocab_size:
            raise ValueError(f"a response holds token ids in [0, {self.vocab_size}), got {src.dtype} "
                             f"in [{src.min()}, {src.max()}]")
        arr = src.astype(np.int32)  # a copy: the caller may reuse its buffer
        digest = _digest(_frozen(arr))
        with self._lock:
            stamp = self._last_stamp = max(time.time_ns(), self._last_stamp + 1)
            old = self._entries.pop(digest, None)
            if old is not None:
                self._tokens -= len(old.tokens)
            self._entries[digest] = _Entry(stamp, digest, arr)
            self._tokens += len(arr)
            self._changes += 1
            while len(self._entries) > self.max_responses or self._tokens > self.max_tokens:
                _, gone = self._entries.popitem(last=False)
                self._tokens -= len(gone.tokens)
                self._horizon = gone.key
        return True

    def evict_oldest(self) -> int:
        """Drop the oldest response (as a bound does: it becomes the horizon); the tokens it held (0: empty)."""
        with self._lock:
            if not self._entries:
                return 0
            _, gone = self._entries.popitem(last=False)
            self._tokens -= len(gone.tokens)
            self._horizon = gone.key
            self._changes += 1
            return len(gone.tokens)

    def _snapshot(self) -> Stored:
        """The store as it is now (references: the arrays are read-only)."""
        with self._lock:
            return Stored(list(self._entries.values()), self._horizon)

    def _prepare(self, other: Stored) -> _Merged:
        """The merge of this store as it is now with ``other``: the O(responses) work, no lock held for it
        (the background thread does it for ``merge_async``, so ``take_merged`` only applies it)."""
        with self._lock:
            base = Stored(list(self._entries.values()), self._horizon)
        merged = merge(base, other, self.max_responses, self.max_tokens)
        held = {e.digest for e in base.entries}
        return _Merged(
            OrderedDict((e.digest, e) for e in merged.entries), sum(len(e.tokens) for e in merged.entries),
            merged.horizon, base.entries[-1].key if base.entries else base.horizon,
            [e for e in merged.entries if e.digest not in held],
        )

    def _apply(self, m: _Merged) -> list[np.ndarray]:
        """Make a prepared merge the store's content, keeping what was added since it was prepared (as the
        newest) and dropping what was evicted since; returns the responses the store did not hold, oldest
        first. Work: O(responses added or evicted since, plus those the merge adds)."""
        with self._lock:
            before = (len(self._entries), self._tokens, self._horizon)
            recent = []  # added since the snapshot: every add is newer than all it held
            for e in reversed(self._entries.values()):
                if e.key <= m.base_last:
                    break
                recent.append(e)
            entries, tokens = m.entries, m.tokens
            horizon = max(m.horizon, self._horizon)
            while entries and next(iter(entries.values())).key <= horizon:  # evicted here since the snapshot
                _, gone = entries.popitem(last=False)
                tokens -= len(gone.tokens)
            # Stamps of later adds stay newer than everything merged, a peer's clock ahead of ours included.
            last = max(self._last_stamp, next(reversed(entries.values())).stamp if entries else 0, horizon[0])
            for e in reversed(recent):  # oldest first; restamped if the merge brought newer ones
                old = entries.pop(e.digest, None)
                if old is not None:
                    tokens -= len(old.tokens)
                last = e.stamp if e.stamp > last else last + 1
                entries[e.digest] = _Entry(last, e.digest, e.tokens)
                tokens += len(e.tokens)
            while len(entries) > self.max_responses or tokens > self.max_tokens:
                _, gone = entries.popitem(last=False)
                tokens -= len(gone.tokens)
                horizon = gone.key
            self._entries, self._tokens, self._horizon, self._last_stamp = entries, tokens, horizon, last
            added = [e.tokens for e in m.added if entries.get(e.digest) is e]
            if added or (len(entries), tokens, horizon) != before:  # not a peer's file that held nothing new:
                self._changes += 1  # two idle replicas would rewrite their files for each other every save
            return added

    # ---------------------------------------------------------------- at start (I/O in the caller's thread)
    def load(self) -> list[np.ndarray]:
        """Read ``path`` (if it exists) into the store; returns the responses it added, oldest first (on the
        empty store of a start: all of the file's).

        Raises ``ResponseStoreError`` for a corrupt, truncated, foreign or oversize file (a refusal at start).
        """
        self._remove_stale_temporaries()
        if not confined.is_confined(self.path):  # a state directory's file has one writer by its name
            claim_file(self.path)
        if not confined.exists(self.path):
            logger.info("freespec: response store %s does not exist yet; starting empty, will save there", self.path)
            return []
        loaded = self._apply(self._prepare(self._read(self.path)))
        logger.info("freespec: response store loaded %d responses from %s", len(loaded), self.path)
        return loaded

    def _remove_stale_temporaries(self) -> None:
        """Remove temporary files of ``path`` left by a crashed save (this process's, or a process now gone)."""
        directory, base = os.path.split(os.path.abspath(self.path))
        prefix = f".{base}."
        names = [n for n, _ in confined.entries(directory) if n.startswith(prefix) and n.endswith(".tmp")]
        for name in names:
            pid = name[len(prefix):].split(".", 1)[0]
            if pid.isdigit() and (int(pid) == os.getpid() or not process_alive(int(pid))):
                try:
                    if confined.unlink(os.path.join(directory, name)):
                        logger.info("freespec: response store removed %s, left by an interrupted save", name)
                except OSError:
                    pass

    def merge_from(self, path: str) -> list[np.ndarray]:
        """Merge a replica's file now (at start; I/O in this thread); returns the responses it added.

        A file that does not exist yet merges nothing; a bad one raises ``ResponseStoreError``.
        """
        if not confined.exists(path):
            logger.info("freespec: response store merge_from %s does not exist yet", path)
            return []
        added = self._apply(self._prepare(self._read(path)))
        logger.info("freespec: response store merged %d new responses from %s", len(added), path)
        return added

    def _read(self, path: str) -> Stored:
        stored = read_store(path, fingerprint=self.fingerprint, vocab_size=self.vocab_size,
                            max_responses=self.max_responses, max_tokens=self.max_tokens)
        return self._unpurged(stored)

    def _unpurged(self, stored: Stored) -> Stored:
        """``stored`` less what purges removed (the purge records read now)."""
        purged = self.purged() if self.purged is not None else None
        if not purged or not stored.entries:
            return stored
        gone = purged.drops(digests_of([e.digest for e in stored.entries]), [e.stamp for e in stored.entries])
        if not gone.any():
            return stored
        return Stored([e for e, out in zip(stored.entries, gone.tolist()) if not out], stored.horizon)

    def drop_purged(self, purged: Purged) -> int:
        """Forget the responses ``purged`` names (the engine's thread, when a new purge is recorded); how many.
        Work: O(responses)."""
        with self._lock:
            entries = list(self._entries.values())
            if not purged or not entries:
                return 0
            gone = purged.drops(digests_of([e.digest for e in entries]), [e.stamp for e in entries])
            for e, out in zip(entries, gone.tolist()):
                if out:
                    del self._entries[e.digest]
                    self._tokens -= len(e.tokens)
            if gone.any():
                self._changes += 1
            return int(gone.sum())

    # ---------------------------------------------------------------- while serving (I/O in the background)
    def save_async(self) -> None:
        """Ask the background thread to save the store as it is now; returns at once (no I/O here).

        One slot: a request not yet started is replaced by this one. After ``close``, and where nothing
        changed since the last save asked for (and it did not fail), it does nothing.
        """
        changes = self._changes
        if not self._closed and changes != self._save_asked:
            self._save_asked = changes
            self._work().request(snapshot=self._snapshot())

    def merge_async(self, paths: Sequence[str]) -> None:
        """Ask the background thread to read those of ``paths`` that changed since it last read them, check
        them and merge them with this store (``merge``); returns at once.

        A good file's merge waits in one slot for ``take_merged``; a missing one is skipped, a bad or unreachable one
        logged (once per distinct error) and tried again when asked next.
        """
        own = os.path.abspath(self.path)
        paths = tuple(p for p in paths if os.path.abspath(p) != own)
        if paths and not self._closed:
            self._work().request(peers=paths)

    def take_merged(self) -> list[np.ndarray]:
        """Merge the peer store the background thread has read and merged, if any; returns the responses it
        added, oldest first. No file I/O; the O(responses) merge was done in the background, so the work
        here is O(responses added)."""
        ready = None if self._files is None else self._files.take()
        if ready is None:
            return []
        path, prepared = ready
        added = self._apply(prepared)
        logger.info("freespec: response store merged %d new responses from %s", len(added), path)
        return added

    def wait_files(self, timeout: float = 30.0) -> bool:
        """Wait for the background work requested so far (tests): True when it is done and no peer store
        waits for ``take_merged``; False when one waits, or after ``timeout`` seconds."""
        return True if self._files is None else self._files.wait(timeout)

    def save(self) -> None:
        """Write the store now, in this thread (a tool's final write); unlike the server's saves, an error is raised."""
        write_store(self.path, self._snapshot(), fingerprint=self.fingerprint, vocab_size=self.vocab_size,
                    perms=self.perms)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the background thread and save a last time, in this thread (at exit; idempotent; never raises)."""
        if self._closed:
            return
        self._closed = True
        if self._files is not None:
            self._files.stop(timeout)
        self._save(self._snapshot(), timeout=timeout, final=True)

    def _work(self) -> FileWorker:
        if self._files is None:
            self._files = FileWorker(self._save, self._read_peers, "response-store")
        return self._files

    def _read_peers(self, paths: tuple[str, ...]):
        """(path, merged) for each of ``paths`` that changed and is good (in the background thread);
        ``FIND_PEERS`` among them: the files ``find_peers`` lists now."""
        if self.purged is not None:
            self.purged()  # read new purge records every round: the engine's thread acts on them (``latest``)
        if FIND_PEERS in paths:
            found = tuple(self.find_peers()) if self.find_peers is not None else ()
            own = os.path.abspath(self.path)
            paths = tuple(p for p in paths if p != FIND_PEERS) + tuple(p for p in found if os.path.abspath(p) != own)
        for path in paths:
            merged = self._read_peer(path, self._peer_seen, self._peer_errors)
            if merged is not None:
                yield path, merged

    def _save(self, stored: Stored, timeout: float = -1, final: bool = False) -> None:
        """Write ``stored``; a failure is logged once per distinct error (the final one always), never raised."""
        if not self._write_lock.acquire(timeout=timeout):
            logger.warning("freespec: response store %s: a save still running after %.0f s; this one skipped",
                           self.path, timeout)
            return
        try:
            stored = self._unpurged(stored)  # right before writing: a purge recorded since is never written back
            write_store(self.path, stored, fingerprint=self.fingerprint, vocab_size=self.vocab_size,
                        perms=self.perms)
        except Exception as e:  # noqa: BLE001 - a save never raises into the server; logged below
            kind = error_kind(e)
            self._save_asked = -1  # the next save_async writes again, changed or not
            if final:
                logger.error("freespec: the final save of the response store to %s failed (%s: %s); the responses "
                             "since its last successful save are lost", self.path, type(e).__name__, e)
            elif kind != self._save_error:
                self._save_error = kind
                logger.warning("freespec: could not save the response store to %s (%s: %s); the server goes on "
                               "and tries again at the next save (logged once per distinct error)",
                               self.path, type(e).__name__, e)
        else:
            self.saves += 1
            if self._save_error is not None:
                self._save_error = None
                logger.info("freespec: response store saved to %s again", self.path)
        finally:
            self._write_lock.release()

    def _read_peer(self, path: str, seen: dict, errors: dict) -> _Merged | None:
        """A peer's store merged with this one, if its file changed since last read and is good; else None
        (logged, never raised). In the background thread."""
        try:
            st = confined.lstat(path)
            stat = (st.st_mtime_ns, st.st_size)
            if seen.get(path) == stat:
                return None
            stored = self._read(path)
        except FileNotFoundError:
            errors.pop(path, None)
            return None
        except (OSError, ResponseStoreError) as e:
            why = str(e) if isinstance(e, ResponseStoreError) else f"{type(e).__name__}: {e}"
            if isinstance(e, ResponseStoreError) and e.reason != UNREADABLE:
                seen[path] = stat  # a bad file is read again only once it changes (an unreadable one: every time)
            if errors.get(path) != why:
                errors[path] = why
                logger.warning("freespec: response store merge_from %s skipped (%s); logged once per distinct "
                               "error", path, why)
            return None
        seen[path] = stat
        errors.pop(path, None)
        return self._prepare(stored)



