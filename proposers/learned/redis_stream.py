"""The ``suffix`` source's learned responses shared through Redis (``state_dir: redis://host:port/db``, issue 87).

The unit shared is one record, a learned response, appended once (``XADD``) by the replica that learned it to its
scope's stream, ``freespec:v1:{<fp16>}:suffix:<scope>`` (``<fp16>``: a hash of the tokenizer's fingerprint and
vocabulary size; ``<scope>``: the scope's hash, or ``shared``; no salt or user text in a key name; the braces keep
a namespace's keys in one Redis Cluster slot). A record's fields: ``t`` the tokens (int32 little-endian bytes),
``w`` the writer (``state_dir.writer_id``), ``s`` its stamp (ns since the epoch, ASCII). Each stream is trimmed
to about ``max_saved_responses`` (``MAXLEN ~``) and named in the namespace's registry set (readers need no
``SCAN``). Each replica keeps its last id per stream and reads only what is new (``XREAD``, a short block); a
start reads the newest records of every stream within its own bounds.

Purges (``freespec state purge URL``, ``purge_scope``/``purge`` below): a scope's purge sets a new random
generation in the ``generations`` hash, logs it in the ``purges`` stream, then deletes the scope's stream; every
replica forgets the scope when it reads the log (within one read), and an append carries the generation its
writer knows, checked in the same Lua script that appends (``_APPEND``): a writer that has not yet seen the
purge never writes the purged text back. A purge by writer logs the digests of the records it removes (the
first 8 bytes of ``response_store``'s digest, as ``proposers.learned.purges``) with the purge's time; by age or in whole,
a cutoff; then it removes them. Every replica drops what they name (a digest stamped up to its purge's time,
anything stamped before the cutoff) from memory, from its reads and from what it appends; the same text learned
after the purge is new learning, kept (``Purges``).

Faults: every Redis call runs on this backend's one thread, with socket timeouts and no retries of its own;
a failure is logged once per kind and tried again with a back-off, while the server goes on with what it
learned (the engine's thread never calls Redis: ``add``/``take`` touch memory only). What could not be appended
waits (bounded: ``max_saved_responses``); a replica whose scope's stream is gone (Redis restarted empty) appends
again what it holds of it. A record is checked when read (fields present, length, ids in the vocabulary, stamp
not past now + 5 min, ``CLOCK_SLACK_S``); a bad one is refused, logged once per kind naming why, and skipped.

Shared with ``recycle``'s backend (``proposers.recycle.shared_rows``): the connection (``connect``), the key names
(``Keys`` by source), the thread with its fault handling (``RedisThread``), the record checks (``writer_and_stamp``)
and the operator's tools: ``list_state`` lists its stream and snapshot, ``purge`` raises its cut (rows carry no
writer: a purge by writer takes every row up to its time).

Bounds: records read per stream and call (``READ_COUNT``), streams followed (``MAX_STREAMS``), purge digests
(``purges.MAX_DIGESTS``), tokens a record (``max_saved_tokens``); a record's bytes beyond that are bounded only by
the server's ``proto-max-bulk-len`` (the reply is read whole before it is checked).
"""
from __future__ import annotations

import hashlib
import logging
import re
import secrets
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from freespec.proposers.learned.state_dir import CLOCK_SLACK_NS
from freespec.proposers.api import SHARED_SCOPE
from freespec.proposers.learned import Learned, LearnedResponses
from freespec.proposers.learned.purges import MAX_DIGESTS, digests_of

logger = logging.getLogger("freespec")

PASSWORD_ENV = "FREESPEC_REDIS_PASSWORD"
SOCKET_TIMEOUT_S = 2.0  # no Redis call waits longer: a stalled server is a fault like a stopped one
BLOCK_MS = 100  # XREAD's block: how late an append or a stop may be noticed
REFRESH_S = 1.0  # the registry and this replica's streams checked (new streams, streams gone)
READ_COUNT = 256  # records per stream and read
MAX_STREAMS = 65_536
MAX_WRITER_BYTES = 160
MAX_CLOCK_AHEAD_NS = CLOCK_SLACK_NS  # the one skew allowed between replicas (``state_dir``)
TAKE_PER_CALL = 512  # records the engine's thread applies per ``take`` (the rest wait for the next)
_NS = re.compile(r"[0-9a-f]{16}")
_STREAM = re.compile(rb"freespec:v1:\{([0-9a-f]{16})\}:suffix:(shared|[0-9a-f]{32})")
_SCOPE = re.compile(r"[0-9a-f]{32}")
NAMESPACES = "freespec:v1:namespaces"

# Append records to a scope's stream unless the scope was purged since the writer last looked: KEYS stream,
# generations, registry, namespaces, announcements (a new stream's key, so readers follow it at once); ARGV scope, the generation the writer knows ('' none), maxlen, namespace,
# then (tokens, writer, stamp) per record. Returns the current generation when it refuses, else ''.
_APPEND = """
local now = redis.call('HGET', KEYS[2], ARGV[1])
if now and now ~= ARGV[2] then return now end
for i = 5, #ARGV, 3 do
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 't', ARGV[i], 'w', ARGV[i + 1], 's', ARGV[i + 2])
end
if redis.call('SADD', KEYS[3], KEYS[1]) == 1 then
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', 1000, '*', 'k', KEYS[1])
end
redis.call('SADD', KEYS[4], ARGV[4])
return ''
"""


def redacted(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``: what logs and messages may show."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    except ValueError:
        return "redis://(unparsable URL)"


def check_url(url: str) -> str:
    """``url`` if it is a usable ``redis://`` or ``rediss://`` URL (host, port, database number); else
    ``ValueError`` naming what is wrong, never the password."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError(f"{redacted(url)}: not a URL redis://[user[:password]@]host:port/db") from None
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise ValueError(f"{redacted(url)}: not a URL redis://[user[:password]@]host:port/db")
    if port is None:
        raise ValueError(f"{redacted(url)}: needs a port (redis://host:6379/0)")
    db = parts.path.lstrip("/")
    if db and not (db.isdigit() and int(db) < 1 << 16):
        raise ValueError(f"{redacted(url)}: the database is a number (redis://host:port/0)")
    return url


def usable_url(url: str) -> str:
    """``check_url``, and the ``redis`` client importable: a source binding a Redis ``state_dir`` calls it at start,
    so a bad URL or a missing client stops the engine naming the option."""
    try:
        check_url(url)
        import redis  # noqa: F401
    except ValueError as e:
        raise ValueError(f"state_dir: {e}") from None
    except ImportError:
        raise ValueError("state_dir redis://...: the redis client is not installed (pip install "
                         "'vllm-freespec[fleet]')") from None
    return url


def connect(url: str, socket_timeout: float = SOCKET_TIMEOUT_S):
    """A client of ``url`` with short socket timeouts and no retries (a fault is handled by the caller); the
    password from the URL, else from ``$FREESPEC_REDIS_PASSWORD``."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from freespec.settings import redis_password

    check_url(url)
    extra = {}
    if urlsplit(url).password is None and redis_password():
        extra["password"] = redis_password()
    return redis.Redis.from_url(url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout,
                                retry=Retry(NoBackoff(), 0), health_check_interval=0, **extra)


def namespace(fingerprint: str, vocab_size: int, candidates: int | None = None) -> str:
    """The key names' hash of a tokenizer (and of ``recycle``'s candidates per token): records of another
    tokenizer, or rows of another width, live under other keys."""
    extra = "" if candidates is None else f"\0{candidates}"
    return hashlib.blake2b(f"{fingerprint}\0{vocab_size}{extra}".encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class Keys:
    """A namespace's key names for one source (``suffix``, ``recycle``): ``freespec:v1:{<ns>}:<source>:...``."""

    ns: str
    source: str = "suffix"

    @property
    def prefix(self) -> str:
        return f"freespec:v1:{{{self.ns}}}:{self.source}"

    def stream(self, scope: str) -> str:
        return f"{self.prefix}:{scope or 'shared'}"

    @property
    def registry(self) -> str:
        return f"{self.prefix}:streams"

    @property
    def generations(self) -> str:
        return f"{self.prefix}:generations"

    @property
    def purges(self) -> str:
        return f"{self.prefix}:purges"

    @property
    def announce(self) -> str:
        return f"{self.prefix}:new-streams"

    @property
    def rows(self) -> str:
        """``recycle``: the compacted snapshot, a hash of every row's newest version (token id -> row)."""
        return f"{self.stream(SHARED_SCOPE)}:rows"

    @property
    def cut(self) -> str:
        """``recycle``: the row stamp (Unix seconds) up to which purges removed rows."""
        return f"{self.prefix}:cut"


def scope_of_key(key: bytes) -> str | None:
    """The scope a stream's key names (``SHARED_SCOPE`` for ``shared``), or None for a key not of this form."""
    m = _STREAM.fullmatch(key)
    if m is None:
        return None
    return SHARED_SCOPE if m.group(2) == b"shared" else m.group(2).decode()


def digest(tokens: np.ndarray) -> bytes:
    """A response's digest, as ``response_store`` makes it (purges name responses by its first 8 bytes)."""
    from freespec.proposers.learned.response_store import _digest

    return _digest(tokens)


class BadRecord(ValueError):
    """A record refused on read; ``kind`` names the check it failed (logged once per kind)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


def parse_record(fields: dict, vocab_size: int, max_tokens: int, now_ns: int) -> tuple[np.ndarray, str, int]:
    """(tokens, writer, stamp) of a stream entry's fields, checked; ``BadRecord`` naming why otherwise."""
    t, w, s = fields.get(b"t"), fields.get(b"w"), fields.get(b"s")
    if t is None or w is None or s is None:
        raise BadRecord("missing field", f"fields {sorted(k.decode('ascii', 'replace') for k in fields)[:8]}, "
                                         "needs t, w and s")
    if not t or len(t) % 4:
        raise BadRecord("bad length", f"tokens of {len(t)} bytes, not a positive multiple of 4")
    if len(t) // 4 > max_tokens:
        raise BadRecord("too long", f"{len(t) // 4} tokens, more than max_saved_tokens {max_tokens}")
    tokens = np.frombuffer(t, dtype="<i4").astype(np.int32)
    if int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size:
        raise BadRecord("token out of vocabulary", f"ids in [{tokens.min()}, {tokens.max()}], the vocabulary "
                                                   f"is [0, {vocab_size})")
    writer, stamp = writer_and_stamp(w, s, now_ns)
    tokens.flags.writeable = False
    return tokens, writer, stamp


def writer_and_stamp(w: bytes, s: bytes, now_ns: int) -> tuple[str, int]:
    """A record's writer and stamp (ns), checked; ``BadRecord`` naming why otherwise."""
    if len(w) > MAX_WRITER_BYTES or not w.isascii() or not w.decode().isprintable():
        raise BadRecord("bad writer", "not a writer's name")
    if not (s.isdigit() and len(s) <= 19 and 0 < int(s) <= now_ns + MAX_CLOCK_AHEAD_NS):
        raise BadRecord("bad stamp", "not a time in ns up to now + 5 min")
    return w.decode(), int(s)


@dataclass(frozen=True, eq=False)
class Purges:
    """The purges read from the ``purges`` stream: digests, each with the time (ns) up to which a response of it
    is purged, and a cutoff (every response stamped before it is purged). Immutable: a change makes a new one."""

    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype="<u8"))  # sorted, unique
    before: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    cutoff: int = 0
    version: int = 0

    def __bool__(self) -> bool:
        return bool(len(self.keys)) or self.cutoff > 0

    def with_digests(self, keys: np.ndarray, before_ns: int) -> "Purges":
        all_keys = np.concatenate([self.keys, keys])
        all_before = np.concatenate([self.before, np.full(len(keys), before_ns, dtype=np.int64)])
        order = np.lexsort((-all_before, all_keys))  # by key, the latest purge first
        all_keys, all_before = all_keys[order], all_before[order]
        first = np.ones(len(all_keys), dtype=bool)
        first[1:] = all_keys[1:] != all_keys[:-1]
        return Purges(all_keys[first], all_before[first], self.cutoff, self.version + 1)

    def with_cutoff(self, cutoff_ns: int) -> "Purges":
        return Purges(self.keys, self.before, max(self.cutoff, cutoff_ns), self.version + 1)

    def drops(self, digests: list[bytes], stamps) -> np.ndarray:
        """Which responses (their 16-byte digests and stamps) are purged: a mask."""
        stamps = np.asarray(stamps, dtype=np.int64)
        out = stamps < self.cutoff
        if len(self.keys) and len(digests):
            keys = digests_of(digests)
            at = np.searchsorted(self.keys, keys)
            at[at == len(self.keys)] = 0
            out |= (self.keys[at] == keys) & (stamps <= self.before[at])
        return out


NOTHING = Purges()


class Held:
    """This replica's responses in memory (digest -> tokens, oldest first): the shared scope within
    ``max_responses``/``max_tokens``, and every salted scope together within as much again, the least recently
    used scope's oldest going first. Thread-safe (the engine's thread adds, the Redis thread reads a scope)."""

    def __init__(self, max_responses: int, max_tokens: int) -> None:
        self.max_responses, self.max_tokens = max_responses, max_tokens
        self._lock = threading.Lock()
        self.scopes: OrderedDict[str, OrderedDict[bytes, tuple[np.ndarray, int]]] = OrderedDict()
        self._count = {True: 0, False: 0}  # by pool: shared (True), salted (False)
        self._tokens = {True: 0, False: 0}

    def add(self, scope: str, key: bytes, tokens: np.ndarray, stamp: int) -> bool:
        """Keep a response (its digest, tokens and stamp); False if it was held already (it becomes the newest)."""
        pool = scope == SHARED_SCOPE
        with self._lock:
            held = self.scopes.setdefault(scope, OrderedDict())
            self.scopes.move_to_end(scope)
            if key in held:
                held.move_to_end(key)
                return False
            held[key] = (tokens, stamp)
            self._count[pool] += 1
            self._tokens[pool] += len(tokens)
            for victim in list(self.scopes):
                if (victim == SHARED_SCOPE) != pool:
                    continue
                entries = self.scopes[victim]
                while entries and (self._count[pool] > self.max_responses or self._tokens[pool] > self.max_tokens):
                    if victim == scope and len(entries) == 1:
                        break  # never the one just added
                    _, (gone, _) = entries.popitem(last=False)
                    self._count[pool] -= 1
                    self._tokens[pool] -= len(gone)
                if not entries and victim != scope:
                    del self.scopes[victim]
                if self._count[pool] <= self.max_responses and self._tokens[pool] <= self.max_tokens:
                    break
            return True

    def learn(self, scope: str, tokens: np.ndarray, vocab_size: int) -> tuple | None:
        """A response this replica learned, cut to ``max_tokens``: held, and returned as the record its backend
        appends (scope, digest, tokens, stamp); None when it is held already, empty or has ids outside the
        vocabulary. Both backends' ``add``."""
        arr = np.array(tokens[: self.max_tokens], dtype=np.int32)
        if not len(arr) or int(arr.min()) < 0 or int(arr.max()) >= vocab_size:
            return None
        arr.flags.writeable = False
        key, stamp = digest(arr), time.time_ns()
        return (scope, key, arr, stamp) if self.add(scope, key, arr, stamp) else None

    def forget(self, scope: str) -> None:
        with self._lock:
            gone = self.scopes.pop(scope, None) or {}
            pool = scope == SHARED_SCOPE
            self._count[pool] -= len(gone)
            self._tokens[pool] -= sum(len(t) for t, _ in gone.values())

    def drop(self, purged: Purges) -> int:
        """Forget the responses ``purged`` names; how many."""
        n = 0
        with self._lock:
            for scope, entries in self.scopes.items():
                keys = list(entries)
                if not keys:
                    continue
                for key, out in zip(keys, purged.drops(keys, [s for _, s in entries.values()]).tolist()):
                    if out:
                        gone, _ = entries.pop(key)
                        self._count[scope == SHARED_SCOPE] -= 1
                        self._tokens[scope == SHARED_SCOPE] -= len(gone)
                        n += 1
        return n

    def of(self, scope: str) -> list[tuple[bytes, np.ndarray, int]]:
        """(digest, tokens, stamp) of what is held of ``scope``, oldest first."""
        with self._lock:
            return [(k, t, s) for k, (t, s) in (self.scopes.get(scope) or {}).items()]

    def held_scopes(self) -> list[str]:
        with self._lock:
            return [s for s, entries in self.scopes.items() if entries]

    def all(self) -> list[tuple[str, np.ndarray]]:
        with self._lock:
            return [(s, t) for s, entries in self.scopes.items() for t, _ in entries.values()]

    def __len__(self) -> int:
        return self._count[True] + self._count[False]


class RedisThread:
    """One backend's Redis work on one background thread (every source that shares through Redis: ``suffix``'s
    ``RedisResponses``, ``recycle``'s ``proposers.recycle.shared_rows``): its client (short socket timeouts, no
    retries), its rounds (``_round``) tried again with a back-off after a failure, each kind of failure logged once
    per outage, its last work at exit (``_at_exit``). A subclass calls ``_start`` at the end of its constructor."""

    what = "learned state"  # how its log lines name the source

    def __init__(self, url: str, thread_name: str) -> None:
        self.url = check_url(url)
        self.where = redacted(url)
        self._client = None
        self._primed = False  # caught up since the last (re)connection
        self._logged: set[str] = set()  # kinds of bad records (and the like) logged
        self._faults: set[str] = set()  # kinds of faults logged in this outage
        self._down: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    def _start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread; it does its last work first (``_at_exit``, bounded by the socket timeout)."""
        self._stop.set()
        self._thread.join(timeout)

    def _round(self) -> None:
        raise NotImplementedError

    def _at_exit(self) -> None:
        """The thread's last work (what waits, appended once)."""

    def _connected(self, client) -> None:
        """A new client: scripts to register."""

    def _run(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            try:
                self._round()
                backoff = 0.05
                if self._down is not None:
                    self._faults.clear()  # a fault of the next outage is logged again
                    logger.info("freespec: %s: Redis %s answers again; catching up", self.what, self.where)
                    self._down = None
            except Exception as e:  # noqa: BLE001 - never let the thread die: logged, tried again
                self._fault(e)
                self._primed = False
                self._stop.wait(backoff)
                backoff = min(2 * backoff, 2.0)
        self._at_exit()

    def _fault(self, e: BaseException) -> None:
        import redis

        kind = type(e).__name__
        if isinstance(e, redis.ResponseError):
            kind += " " + (str(e).split(" ", 1)[0] if str(e) else "")
        self._down = kind
        if kind not in self._faults:
            self._faults.add(kind)
            logger.warning("freespec: %s: Redis %s failed (%s: %s); the server goes on with what this replica "
                           "learned and tries again (logged once per kind and outage)", self.what, self.where,
                           type(e).__name__, str(e)[:200])

    def _redis(self):
        if self._client is None:
            self._client = connect(self.url)
            self._connected(self._client)
        return self._client

    def _log_once(self, kind: str, message: str, *args) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            logger.warning(f"freespec: {self.what}: " + message, *args)


class RedisResponses(RedisThread, LearnedResponses):
    """The Redis backend (see the module docstring): ``add``/``take``/``close`` on the engine's thread, every
    Redis call on its own thread ``freespec-redis``."""

    what = "suffix learned state"

    def __init__(self, url: str, *, fingerprint: str, vocab_size: int, max_responses: int, max_tokens: int,
                 writer: str | None = None, block_ms: int = BLOCK_MS, refresh_s: float = REFRESH_S) -> None:
        from freespec.proposers.learned.state_dir import writer_id

        super().__init__(url, "freespec-redis")
        self.vocab_size, self.max_responses, self.max_tokens = vocab_size, max_responses, max_tokens
        self.keys = Keys(namespace(fingerprint, vocab_size))
        self.writer = writer or writer_id()
        self.block_ms, self.refresh_s = block_ms, refresh_s
        self.held = Held(max_responses, max_tokens)
        self._out: deque = deque(maxlen=max_responses)  # (scope, digest, tokens, stamp) not appended yet
        self._in: deque = deque(maxlen=2 * max_responses)  # (scope, digest, tokens, stamp) read, to apply
        self._lock = threading.Lock()  # _in, _forget and _purged: the Redis thread's results
        self._forget: list[str] = []
        self._purged = NOTHING
        self._purged_applied = 0
        self._gens: dict[str, str] = {}  # scope -> the generation this replica knows
        self._existed: set[str] = set()  # scopes whose stream this replica saw or wrote (gone: restarted empty)
        self._last: dict[bytes, bytes] = {}  # stream key -> the last id read
        self._purge_last = b"0-0"
        self._announce_last: bytes | None = None
        self._script = None
        self._refreshed = 0.0
        self.appended = self.applied = self.refused = self.reappended = 0
        self.lags_ns: deque = deque(maxlen=10_000)  # a record's stamp to its ``take`` here (others' records)
        self._start()

    # ---------------------------------------------------------------- the engine's thread: memory only
    def add(self, scope: str, tokens: np.ndarray) -> None:
        record = self.held.learn(scope, tokens, self.vocab_size)
        if record is not None:
            self._out.append(record)

    def take(self) -> Learned:
        out = Learned()
        with self._lock:  # a scope leaves ``_forget`` and ``held`` at once (``_refresh`` appends neither)
            out.forget, self._forget = self._forget, []
            for scope in out.forget:
                self.held.forget(scope)
            purged = self._purged
            batch = [self._in.popleft() for _ in range(min(len(self._in), TAKE_PER_CALL))]
        if purged.version != self._purged_applied:
            self._purged_applied = purged.version
            if self.held.drop(purged):
                out.rebuild = self.held.all()
        now = time.time_ns()
        for scope, key, tokens, stamp in batch:
            if self.held.add(scope, key, tokens, stamp):
                out.new.append((scope, tokens))
                self.applied += 1
                self.lags_ns.append(now - stamp)
        return out

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Tests: until nothing waits to be appended (True), or ``timeout``."""
        deadline = time.monotonic() + timeout
        while self._out and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._out

    # ---------------------------------------------------------------- the Redis thread
    def _at_exit(self) -> None:
        try:
            self._flush()  # at exit: what waits, once, within the socket timeout
        except Exception as e:  # noqa: BLE001
            if self._out:
                logger.warning("freespec: suffix learned state: %d response(s) not appended to Redis %s at exit "
                               "(%s)", len(self._out), self.where, type(e).__name__)

    def _connected(self, client) -> None:
        self._script = client.register_script(_APPEND)

    def _round(self) -> None:
        import redis

        c = self._redis()
        if not self._primed:
            gens = c.hgetall(self.keys.generations) if c.hlen(self.keys.generations) <= MAX_STREAMS else {}
            for scope, gen in gens.items():
                if _SCOPE.fullmatch(scope.decode("ascii", "replace")):
                    self._gens[scope.decode()] = gen.decode("ascii", "replace")
            self._read_purges(c.xrange(self.keys.purges, b"(" + self._purge_last, count=10_000)
                              if self._purge_last != b"0-0" else c.xrange(self.keys.purges, count=10_000))
            self._announce_last = None
            self._refresh(c)
            self._primed = True
        try:
            self._flush()
        except redis.ResponseError as e:  # a server refusing writes (maxmemory) still serves reads
            self._fault(e)
        if time.monotonic() - self._refreshed >= self.refresh_s:
            self._refresh(c)
        if self._announce_last is None:
            newest = c.xrevrange(self.keys.announce, count=1)
            self._announce_last = newest[0][0] if newest else b"0-0"
        streams = {self.keys.purges: self._purge_last, self.keys.announce: self._announce_last, **self._last}
        for key, entries in c.xread(streams, count=READ_COUNT, block=self.block_ms) or ():
            if key == self.keys.purges.encode():
                self._read_purges(entries)
            elif key == self.keys.announce.encode():
                self._announce_last = entries[-1][0]
                self._refreshed = 0.0  # a new stream: followed at the next round
            else:
                self._records(key, entries)
                self._last[key] = entries[-1][0]

    def _flush(self) -> None:
        """Append what waits, scope by scope, unless the scope was purged since (``_APPEND``)."""
        import redis

        if not self._out:
            return
        waiting = []
        while self._out:
            waiting.append(self._out.popleft())
        purged = self._purged
        if purged:
            out = purged.drops([w[1] for w in waiting], [w[3] for w in waiting])
            waiting = [w for w, o in zip(waiting, out.tolist()) if not o]
        by_scope: dict[str, list] = {}
        for w in waiting:
            by_scope.setdefault(w[0], []).append(w)
        try:
            for scope in list(by_scope):
                self._append(scope, by_scope[scope])
                del by_scope[scope]
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError, OSError):
            left = [w for ws in by_scope.values() for w in ws]
            self._out.extendleft(reversed(left))  # tried again; the bound drops the oldest
            raise

    def _append(self, scope: str, records: list, reappend: bool = False) -> None:
        args = [scope, self._gens.get(scope, ""), self.max_responses, self.keys.ns]
        for _, _, tokens, stamp in records:
            args += [tokens.astype("<i4", copy=False).tobytes(), self.writer, str(stamp)]
        keys = [self.keys.stream(scope), self.keys.generations, self.keys.registry, NAMESPACES, self.keys.announce]
        now = self._script(keys=keys, args=args)
        if now:  # purged since this replica last looked: nothing of it is written back; forgotten here
            self._purged_scope(scope, now.decode("ascii", "replace"))
            return
        self._existed.add(scope)
        if reappend:
            self.reappended += len(records)
        else:
            self.appended += len(records)

    def _refresh(self, c) -> None:
        """New streams in the registry (caught up with their newest records), and this replica's streams gone
        (Redis restarted empty, or a purge): what it holds of a scope is appended again, unless purged."""
        self._refreshed = time.monotonic()
        if c.scard(self.keys.registry) > MAX_STREAMS:
            self._log_once("too many streams", "the registry names more than %d streams; new ones are not followed",
                           MAX_STREAMS)
            members = set(self._last)
        else:
            members = c.smembers(self.keys.registry)
        salted = [k for k in members if scope_of_key(k) not in (None, SHARED_SCOPE)]
        per_salted = max(16, self.max_responses // max(1, len(salted)))
        for key in sorted(members):
            scope = scope_of_key(key)
            if scope is None or not key.startswith(self.keys.prefix.encode()) or key in self._last:
                continue
            newest = c.xrevrange(key, count=self.max_responses if scope == SHARED_SCOPE else per_salted)
            self._last[key] = newest[0][0] if newest else b"0-0"
            self._records(key, newest[::-1])
        held = self.held.held_scopes()
        known = list(self._last)
        pipe = c.pipeline(transaction=False)
        for key in known:
            pipe.exists(key)
        for scope in held:
            pipe.exists(self.keys.stream(scope))
        found = pipe.execute()
        for key, there in zip(known, found[: len(known)]):
            if not there:
                self._last[key] = b"0-0"  # read it from its start when it comes back
        with self._lock:
            purged_here = set(self._forget)  # read from the purge log, not yet forgotten by the engine's thread
        for scope, there in zip(held, found[len(known):]):
            if there:
                self._existed.add(scope)
            elif scope in self._existed and scope not in purged_here:
                mine = [(scope, k, t, s) for k, t, s in self.held.of(scope)]
                if self._purged:
                    out = self._purged.drops([m[1] for m in mine], [m[3] for m in mine])
                    mine = [m for m, o in zip(mine, out.tolist()) if not o]
                for i in range(0, len(mine), 256):
                    self._append(scope, mine[i: i + 256], reappend=True)
                if mine:
                    logger.info("freespec: suffix learned state: a stream was gone from Redis %s; %d response(s) "
                                "this replica holds appended again", self.where, len(mine))

    def _records(self, key: bytes, entries) -> None:
        scope = scope_of_key(key)
        if scope is None:
            return
        now = time.time_ns()
        got = []
        for _, fields in entries:
            try:
                tokens, writer, stamp = parse_record(fields, self.vocab_size, self.max_tokens, now)
            except BadRecord as e:
                self.refused += 1
                self._log_once(e.kind, "a record of Redis %s refused (%s); skipped (logged once per kind)",
                               self.where, e)
                continue
            if writer != self.writer:
                got.append((scope, digest(tokens), tokens, stamp))
        if not got:
            return
        with self._lock:
            purged = self._purged
            if purged:
                out = purged.drops([g[1] for g in got], [g[3] for g in got])
                got = [g for g, o in zip(got, out.tolist()) if not o]
            self._in.extend(got)

    def _read_purges(self, entries) -> None:
        purged = self._purged
        for entry_id, fields in entries:
            self._purge_last = entry_id
            kind = fields.get(b"k")
            if kind == b"scope":
                scope = fields.get(b"s", b"").decode("ascii", "replace")
                gen = fields.get(b"g", b"").decode("ascii", "replace")
                if _SCOPE.fullmatch(scope) and gen:
                    self._purged_scope(scope, gen)
            elif kind in (b"digests", b"before"):
                d, b = fields.get(b"d", b""), fields.get(b"b", b"")
                if (len(d) % 8 or len(purged.keys) + len(d) // 8 > MAX_DIGESTS or not b.isdigit()
                        or len(b) > 19):
                    self._log_once("purge record", "a purge record in Redis %s skipped (damaged, or over %d "
                                   "digests in all)", self.where, MAX_DIGESTS)
                    continue
                purged = (purged.with_digests(np.frombuffer(d, dtype="<u8"), int(b)) if kind == b"digests"
                          else purged.with_cutoff(int(b)))
        if purged is not self._purged:
            with self._lock:
                self._purged = purged
                if self._in:
                    items = list(self._in)
                    out = purged.drops([g[1] for g in items], [g[3] for g in items])
                    self._in = deque((g for g, o in zip(items, out.tolist()) if not o), maxlen=self._in.maxlen)

    def _purged_scope(self, scope: str, gen: str) -> None:
        if self._gens.get(scope) == gen:
            return
        self._gens[scope] = gen
        with self._lock:
            self._in = deque((g for g in self._in if g[0] != scope), maxlen=self._in.maxlen)
            self._forget.append(scope)
        kept = deque((w for w in self._out if w[0] != scope), maxlen=self._out.maxlen)
        self._out.clear()
        self._out.extend(kept)


# ---------------------------------------------------------------- the operator's tools (freespec state URL)
@dataclass(frozen=True)
class StreamInfo:
    name: str  # "<namespace>/<scope or shared>"; recycle's "<namespace>/recycle"
    records: int
    bytes: int  # recycle's: the stream and the snapshot
    newest_age_s: float
    rows: int | None = None  # recycle's: rows in the snapshot


def _namespaces(c) -> list[str]:
    return sorted(n for n in (m.decode("ascii", "replace") for m in c.smembers(NAMESPACES)) if _NS.fullmatch(n))


def _streams(c, keys: Keys) -> list[bytes]:
    return sorted(k for k in c.smembers(keys.registry) if scope_of_key(k) is not None
                  and k.startswith(keys.prefix.encode()))


def _server_now_ms(c) -> int:
    sec, usec = c.time()
    return int(sec) * 1000 + int(usec) // 1000


def list_state(url: str) -> list[StreamInfo]:
    """Every stream the suffix source keeps in Redis (by tokenizer namespace and scope): records, bytes, age."""
    c = connect(url)
    now = _server_now_ms(c)
    out = []
    for ns in _namespaces(c):
        for key in _streams(c, Keys(ns)):
            newest = c.xrevrange(key, count=1)
            age = (now - int(newest[0][0].split(b"-")[0])) / 1000 if newest else float("nan")
            out.append(StreamInfo(key.decode().rsplit(":", 1)[1].join((f"{ns}/", "")), int(c.xlen(key)),
                                  int(c.memory_usage(key) or 0), age))
        rk = Keys(ns, "recycle")
        stream = rk.stream(SHARED_SCOPE)
        if c.exists(stream, rk.rows):
            newest = c.xrevrange(stream, count=1)
            age = (now - int(newest[0][0].split(b"-")[0])) / 1000 if newest else float("nan")
            out.append(StreamInfo(f"{ns}/recycle", int(c.xlen(stream)), int(c.memory_usage(stream) or 0)
                                  + int(c.memory_usage(rk.rows) or 0), age, int(c.hlen(rk.rows))))
    return out


def purge_scope(url: str, scope: str) -> int:
    """Remove a salted scope's records from every namespace: a new generation first (every replica forgets the
    scope when it reads it, and no writer appends to it under the old one), then its stream. Records removed."""
    if not _SCOPE.fullmatch(scope):
        raise ValueError("a scope is the 32 hex digits of a cache_salt's hash")
    c = connect(url)
    gone = 0
    for ns in _namespaces(c):
        keys = Keys(ns)
        gen = secrets.token_hex(16)
        c.hset(keys.generations, scope, gen)
        c.xadd(keys.purges, {"k": "scope", "s": scope, "g": gen}, maxlen=10_000, approximate=True)
        stream = keys.stream(scope)
        gone += int(c.xlen(stream))
        c.delete(stream)
        c.srem(keys.registry, stream)
    return gone


def purge(url: str, *, older_than_s: float | None = None, writer: str | None = None) -> int:
    """Remove records: every one (a cutoff of now), those stamped more than ``older_than_s`` ago (a cutoff), or
    ``writer``'s (their digests, with the purge's time). What names them is logged first (every replica drops it
    from memory, reads and appends), then they go. Records removed. Times: the Redis server's clock."""
    c = connect(url)
    now_ns = _server_now_ms(c) * 1_000_000
    cutoff = None if writer is not None else now_ns - int((older_than_s or 0.0) * 1e9)
    gone = 0
    for ns in _namespaces(c):
        keys = Keys(ns)
        if cutoff is not None:  # logged before anything goes
            c.xadd(keys.purges, {"k": "before", "b": str(cutoff)}, maxlen=10_000, approximate=True)
        for key in _streams(c, keys):
            chosen, digests, start = [], [], b"-"
            while True:
                page = c.xrange(key, min=start, count=1000)
                for entry_id, fields in page:
                    s = fields.get(b"s", b"")
                    stamp = int(s) if s.isdigit() and len(s) <= 19 else 0
                    if cutoff is not None and stamp >= cutoff:
                        continue
                    if writer is not None and fields.get(b"w", b"").decode("ascii", "replace") != writer:
                        continue
                    chosen.append(entry_id)
                    t = fields.get(b"t", b"")
                    if t and len(t) % 4 == 0:
                        digests.append(digest(np.frombuffer(t, dtype="<i4").astype(np.int32)))
                if len(page) < 1000:
                    break
                start = b"(" + page[-1][0]
            if writer is not None:
                keys_digests = np.unique(digests_of(digests))
                for i in range(0, len(keys_digests), 65_536):  # logged before anything goes
                    c.xadd(keys.purges, {"k": "digests", "d": keys_digests[i: i + 65_536].tobytes(),
                                         "b": str(now_ns)}, maxlen=10_000, approximate=True)
            for i in range(0, len(chosen), 1000):
                gone += int(c.xdel(key, *chosen[i: i + 1000]))
        # recycle's rows carry no writer: a purge by writer takes every row up to its time, as the folder's does
        gone += _purge_rows(c, Keys(ns, "recycle"), now_ns // 1_000_000_000 if cutoff is None else cutoff // 1_000_000_000)
    return gone


# Raise a namespace's recycle cut (it never falls) and log it in the stream: KEYS cut, stream; ARGV cut, maxlen.
_RAISE_CUT = """
local old = tonumber(redis.call('GET', KEYS[1]) or '0')
local new = math.max(old, tonumber(ARGV[1]))
redis.call('SET', KEYS[1], tostring(new))
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'k', 'cut', 'b', tostring(new))
return tostring(new)
"""


def _purge_rows(c, keys: "Keys", cut_s: int) -> int:
    """Purge recycle's rows stamped at or before ``cut_s``: the cut first (every replica clears them when it reads
    it, and no writer that has not seen it appends), then the snapshot's rows and the stream's records of them.
    Rows and records removed."""
    stream = keys.stream(SHARED_SCOPE)
    if cut_s <= 0 or not c.exists(stream, keys.rows):
        return 0
    c.eval(_RAISE_CUT, 2, keys.cut, stream, cut_s, 1000)
    gone, cursor = 0, 0
    while True:
        cursor, page = c.hscan(keys.rows, cursor, count=1000)
        old = [k for k, v in page.items() if len(v) < 4 or int.from_bytes(v[:4], "little") <= cut_s]
        if old:
            gone += int(c.hdel(keys.rows, *old))
        if not cursor:
            break
    chosen, start = [], b"-"
    while True:
        page = c.xrange(stream, min=start, count=1000)
        for entry_id, fields in page:
            s = fields.get(b"s", b"")
            if fields.get(b"k") == b"rows" and (not s.isdigit() or int(s) // 1_000_000_000 <= cut_s):
                chosen.append(entry_id)
        if len(page) < 1000:
            break
        start = b"(" + page[-1][0]
    for i in range(0, len(chosen), 1000):
        gone += int(c.xdel(stream, *chosen[i: i + 1000]))
    return gone


__all__ = ["RedisResponses", "check_url", "connect", "list_state", "purge", "purge_scope", "redacted",
           "PASSWORD_ENV"]
