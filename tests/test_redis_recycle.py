"""``recycle``'s matrix shared through Redis (issue 87; ``proposers/recycle/shared_rows.py``), against a real
``redis-server`` (``tests/redis_helpers.py``; skipped, saying why, where it is missing): rows one replica learns
are merged on another by the newest-row rule, a starting replica catches up from the snapshot, rows of another
width never meet, a bad record is refused naming why; purges (by writer, in whole) clear every replica and are
never written back; Redis stopped and restarted empty, paused (SIGSTOP) or at ``maxmemory`` costs no step a wait
and loses nothing once it is back; two replica processes draft from each other's learning."""
from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from redis_helpers import RedisServer, redis_missing, wait_until
from script_process import ScriptProcess

from freespec.proposers.base import EngineInfo, Row, ScoredPositions
from freespec.proposers.recycle.matrix import Rows

pytestmark = pytest.mark.skipif(redis_missing() is not None, reason=str(redis_missing()))

VOCAB, C, FP = 100, 8, "sha256:tok-a"


def backend(url: str, writer: str, **kw):
    from freespec.proposers.recycle.shared_rows import SharedRows

    return SharedRows(url, writer=writer, **{"fingerprint": FP, "vocab_size": VOCAB, "candidates": C, **kw})


def rows(pairs: dict[int, int], stamp: int | None = None, c: int = C) -> Rows:
    """One row per token: its first candidate ``pairs[token]`` (probability 0.9), the rest 99."""
    toks = np.array(sorted(pairs), dtype=np.int64)
    ids = np.full((len(toks), c), 99, dtype=np.int32)
    ids[:, 0] = [pairs[t] for t in toks]
    probs = np.zeros((len(toks), c), dtype=np.float16)
    probs[:, 0] = 0.9
    return Rows(toks, ids, probs, np.full(len(toks), stamp or int(time.time()), dtype=np.uint32))


class Merged:
    """A replica's matrix as the proposer keeps it, fed by its backend's ``take``."""

    def __init__(self, b) -> None:
        from freespec.proposers.recycle.matrix import Matrix

        self.b, self.m, self.cut = b, Matrix.empty(VOCAB, C, FP), 0

    def __call__(self) -> None:
        from freespec.proposers.recycle.matrix import clear_rows_up_to, merge_rows

        got = self.b.take()
        if got.cut > self.cut:
            self.cut = got.cut
            clear_rows_up_to(self.m, got.cut)
        for part in got.parts:
            merge_rows(self.m, part)

    def first(self, token: int) -> int:
        return int(self.m.ids[token, 0])

    def has(self, token: int, candidate: int, timeout: float = 10.0) -> bool:
        return bool(wait_until(lambda: (self(), self.first(token) == candidate)[1], timeout))


@pytest.fixture
def pair(redis_server):
    a, b = backend(redis_server.url, "node-a.1.1"), backend(redis_server.url, "node-b.1.2")
    yield a, b, Merged(b)
    a.close()
    b.close()


def test_rows_learned_on_one_replica_are_merged_on_another_newest_row_winning(pair):
    a, b, got = pair
    now = int(time.time())
    a.put(rows({1: 2, 3: 4}, now - 10))
    assert got.has(1, 2) and got.has(3, 4)
    b_own = rows({3: 7}, now)  # b's own newer row of token 3 is kept against a's older one
    got.m.ids[3], got.m.stamps[3] = b_own.ids[0], now
    a.put(rows({3: 5}, now - 5))
    a.put(rows({1: 6}, now))
    assert got.has(1, 6)
    assert got.first(3) == 7


def test_a_starting_replica_catches_up_from_the_snapshot_and_another_width_never_meets(redis_server):
    a = backend(redis_server.url, "node-a.1.1")
    for i in range(30):
        a.put(rows({i: i + 1}))
        assert a.wait_idle()
    a.close()
    late = Merged(backend(redis_server.url, "node-c.1.3"))
    assert late.has(29, 30) and all(late.first(i) == i + 1 for i in range(30))
    other = backend(redis_server.url, "node-d.1.4", candidates=4)
    time.sleep(0.5)
    assert not other.take().parts  # rows of 8 candidates live under another namespace
    other.close()
    late.b.close()
    names = b" ".join(redis_server.client().keys())
    assert names.count(b":recycle:shared:rows") == 1 and b"tok-a" not in names


def test_a_corrupt_record_is_refused_naming_why_once_per_kind_and_the_rest_go_on(pair, redis_server, caplog):
    a, b, got = pair
    a.put(rows({1: 2}))
    assert got.has(1, 2)
    stream, c = b.keys.stream(""), redis_server.client()
    good = rows({5: 6})
    fields = {"k": "rows", "c": str(C), "r": good.rows.astype("<i4").tobytes(), "i": good.ids.tobytes(),
              "p": good.probs.tobytes(), "m": good.stamps.tobytes(), "w": "x.1.1", "s": str(time.time_ns())}
    with caplog.at_level(logging.WARNING, logger="freespec"):
        c.xadd(stream, {**fields, "r": np.array([500], dtype="<i4").tobytes()})  # a row outside the vocabulary
        c.xadd(stream, {**fields, "i": np.full(C, 5000, dtype="<i4").tobytes()})  # a candidate outside it
        c.xadd(stream, {**fields, "p": np.full(C, np.nan, dtype="<f2").tobytes()})
        c.xadd(stream, {**fields, "m": np.array([time.time() + 10**6], dtype="<u4").tobytes()})
        c.xadd(stream, {**fields, "c": "4"})
        c.xadd(stream, {**fields, "i": b"abc"})
        c.xadd(stream, {"k": "rows", "w": "x.1.1"})
        c.xadd(stream, {**fields, "r": np.array([5, 5], dtype="<i4").tobytes(), "i": fields["i"] * 2,
                        "p": fields["p"] * 2, "m": fields["m"] * 2})
        a.put(rows({3: 4}))
        assert got.has(3, 4) and wait_until(lambda: a.refused == 8, 5)
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    for why in ("row out of vocabulary", "token out of vocabulary", "bad probability", "bad stamp",
                "other candidates", "bad length", "missing field", "repeated row"):
        assert sum(why in m for m in refused) == 2, why  # once per kind, by each replica
    assert b.refused == 8 and got.first(5) == -1


def test_a_purge_clears_every_replica_and_a_writer_that_has_not_seen_it_writes_nothing_back(pair, redis_server,
                                                                                            capsys):
    from freespec.cli.main import main

    a, b, got = pair
    old = int(time.time()) - 60
    a.put(rows({1: 2, 3: 4}, old))
    assert got.has(1, 2)
    assert main(["state", "list", redis_server.url]) == 0
    out = capsys.readouterr().out
    assert "/recycle\t" in out and "\t1 records\t2 rows\t" in out  # one record of two rows, both in the snapshot
    assert main(["state", "purge", redis_server.url, "--writer", "node-a.1.1"]) == 0
    assert "3 record(s) removed" in capsys.readouterr().out  # 2 snapshot rows + 1 record
    assert wait_until(lambda: (got(), got.first(1) == -1 and got.first(3) == -1)[1], 5)
    assert b.cut >= old
    # a writer that has not read the purge yet (it knows no cut) appends a row learned before it: refused
    stale = backend(redis_server.url, "node-s.1.4")
    stale._stop.set()
    stale._thread.join()
    stale._redis()
    stale._known_cut, stale.cut = b"0", 0
    stale.put(rows({7: 8}, old))
    stale._flush()
    assert stale.appended == 0 and stale.cut >= old and not stale._out
    assert not redis_server.client().hlen(b.keys.rows)
    later = Merged(backend(redis_server.url, "node-c.1.3"))
    time.sleep(0.5)
    later()
    assert later.first(1) == -1 and later.first(7) == -1
    later.b.close()
    a.put(rows({9: 10}, int(time.time()) + 2))  # learned after the purge: shared
    assert got.has(9, 10)


def test_redis_down_at_start_then_up_catches_up(tmp_path):
    server = RedisServer(tmp_path / "r")
    a, b = backend(server.url, "node-a.1.1"), backend(server.url, "node-b.1.2")
    got = Merged(b)
    a.put(rows({1: 2}))
    t = time.perf_counter()
    got()
    assert time.perf_counter() - t < 0.01  # nothing waits on Redis
    server.start()
    try:
        assert got.has(1, 2, timeout=15)
    finally:
        a.close()
        b.close()
        server.stop()


def test_redis_paused_with_sigstop_then_at_maxmemory_no_step_waits_and_it_catches_up(pair, redis_server, caplog):
    a, b, got = pair
    a.put(rows({1: 2}))
    assert got.has(1, 2)
    redis_server.pause()
    try:
        slowest = 0.0
        for i in range(40):
            t = time.perf_counter()
            a.put(rows({10 + i: 3}))
            got()
            slowest = max(slowest, time.perf_counter() - t)
            time.sleep(0.05)
        assert slowest < 0.05
    finally:
        redis_server.resume()
    assert got.has(49, 3, timeout=15)
    c = redis_server.client()
    with caplog.at_level(logging.WARNING, logger="freespec"):
        c.config_set("maxmemory", 1)
        a.put(rows({60: 61}))
        assert wait_until(lambda: any("OutOfMemoryError" in r.getMessage() for r in caplog.records), 5)
        got()
        assert got.first(60) == -1
        c.config_set("maxmemory", 0)
        assert got.has(60, 61)
    assert sum("OutOfMemoryError" in r.getMessage() for r in caplog.records) == 1


def scored(pairs: dict[int, int]) -> ScoredPositions:
    tokens = np.array(list(pairs), dtype=np.int32)
    ids = np.full((len(pairs), C), 99, dtype=np.int32)
    ids[:, 0] = list(pairs.values())
    probs = np.zeros((len(pairs), C), dtype=np.float32)
    probs[:, 0] = 0.97
    return ScoredPositions(tokens, ids, probs)


def proposer(url: str, writer: str, monkeypatch):
    from freespec.proposers.learned import state_dir
    from freespec.proposers.recycle.proposer import RecycleOptions, RecycleProposer

    monkeypatch.setattr(state_dir, "writer_id", lambda: writer)  # one process per replica in a fleet
    p = RecycleProposer(RecycleOptions(), 4)
    p.bind(EngineInfo(vocab_size=VOCAB, model="m", tokenizer_fingerprint=lambda: FP, state_dir=url))
    return p


def drafted(p, *tokens: int) -> list[int]:
    from freespec.proposers.api import StepContext

    [d] = p.draft([Row(1, np.asarray(tokens, dtype=np.int32), 1)], StepContext())
    p.release(1)
    return list(d.tokens)


def test_the_proposer_drafts_what_another_learned_and_shares_again_after_redis_restarted_empty(
        redis_server, monkeypatch, caplog):
    one = proposer(redis_server.url, "node-1.1.1", monkeypatch)
    two = proposer(redis_server.url, "node-2.1.2", monkeypatch)
    try:
        one.observe(scored({1: 2, 2: 3, 3: 4}))
        one.idle()
        one._last_save = 0.0
        one.idle()  # handed over at once (a second is the interval)
        assert wait_until(lambda: drafted(two, 5, 1)[:3] == [2, 3, 4], 10)
        with caplog.at_level(logging.WARNING, logger="freespec"):
            redis_server.stop()
            one.observe(scored({7: 8}))  # learned while Redis is down
            t = time.perf_counter()
            for _ in range(20):
                one._last_save = 0.0
                one.idle()
                two.idle()
            assert time.perf_counter() - t < 0.1
            redis_server.start()  # the same port, empty
            assert wait_until(lambda: (one.idle(), two.idle(), two.matrix.ids[7, 0] == 8)[2], 15)
        late = proposer(redis_server.url, "node-3.1.3", monkeypatch)
        # appended again from what they held, at their next steps (an idle engine's ``idle()`` hands them over too)
        assert wait_until(lambda: (one.idle(), two.idle(), drafted(late, 5, 1)[:3] == [2, 3, 4])[2], 15)
        late.close()
    finally:
        one.close()
        two.close()


# One replica process: a recycle proposer bound to Redis, driven over stdin ("observe T:N ..." learns T -> N,
# "draft T..", "close"), each command answered "ok ...".
REPLICA = """
import sys, time
import numpy as np
from freespec.proposers.api import StepContext
from freespec.proposers.base import EngineInfo, Row, ScoredPositions
from freespec.proposers.recycle import shared_rows
from freespec.proposers.recycle.proposer import RecycleOptions, RecycleProposer

shared_rows.SHARE_EVERY_S = 0.05
p = RecycleProposer(RecycleOptions(), 4)
p.bind(EngineInfo(vocab_size=100, model="m", tokenizer_fingerprint=lambda: "sha256:tok-a", state_dir=sys.argv[1]))
print("ok", flush=True)
for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "observe":
        pairs = [tuple(map(int, a.split(":"))) for a in args]
        ids = np.full((len(pairs), 8), 99, dtype=np.int32)
        ids[:, 0] = [n for _, n in pairs]
        probs = np.zeros((len(pairs), 8), dtype=np.float32)
        probs[:, 0] = 0.97
        p.observe(ScoredPositions(np.array([t for t, _ in pairs], dtype=np.int32), ids, probs))
        time.sleep(0.06)
        p.idle()
    elif cmd == "draft":
        time.sleep(0.05)
        [d] = p.draft([Row(1, np.array([int(a) for a in args], dtype=np.int32), 1)], StepContext())
        p.release(1)
        print("ok", ",".join(map(str, d.tokens)), flush=True)
        continue
    elif cmd == "close":
        p.close()
        print("ok", flush=True)
        break
    print("ok", flush=True)
"""


def test_two_replica_processes_draft_from_each_others_learning_through_redis(redis_server):
    one, two = ScriptProcess(REPLICA, redis_server.url), ScriptProcess(REPLICA, redis_server.url)
    try:
        one.do("observe 1:2 2:3 3:4")
        two.do("observe 10:11 11:12 12:13")
        assert wait_until(lambda: two.do("draft 5 1").startswith("2,3,4"), 10)
        assert wait_until(lambda: one.do("draft 5 10").startswith("11,12,13"), 10)
    finally:
        for p in (one, two):
            p.do("close")
            p.proc.wait(10)
