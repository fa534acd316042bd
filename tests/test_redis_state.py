"""The suffix source's learned responses shared through Redis (issue 87; ``proposers/learned/redis_stream.py``),
against a real ``redis-server`` (``tests/redis_helpers.py``; skipped, saying why, where it is missing): a response
learned on one replica reaches another, never another scope; purges by scope, writer and in whole hold on every
replica; the faults (Redis down at start, stopped, restarted empty, paused with SIGSTOP, at ``maxmemory``, a
corrupt record) cost no request a wait and lose nothing once Redis is back; the password is never shown."""
from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from script_process import ScriptProcess
from redis_helpers import RedisServer, redis_missing, wait_until

from freespec.proposers.api import SHARED_SCOPE
from freespec.vllm_plugins.request_ids import scope_of

pytestmark = pytest.mark.skipif(redis_missing() is not None, reason=str(redis_missing()))

X, Y = scope_of("tenant-x"), scope_of("tenant-y")
KW = dict(fingerprint="sha256:tok-a", vocab_size=1000, max_responses=100, max_tokens=100_000)


def backend(url: str, writer: str, **kw):
    from freespec.proposers.learned.redis_stream import RedisResponses

    return RedisResponses(url, writer=writer, **{**KW, **kw})


class Collect:
    """What a backend's ``take`` brought, over calls."""

    def __init__(self, b) -> None:
        self.b, self.new, self.forget, self.rebuilds = b, [], [], []

    def __call__(self):
        got = self.b.take()
        self.new += [(s, t.tolist()) for s, t in got.new]
        self.forget += got.forget
        if got.rebuild is not None:
            self.rebuilds.append([(s, t.tolist()) for s, t in got.rebuild])
        return got

    def has(self, scope: str, tokens: list[int], timeout: float = 10.0) -> bool:
        return bool(wait_until(lambda: (self(), (scope, tokens) in self.new)[1], timeout))


@pytest.fixture
def pair(redis_server):
    a, b = backend(redis_server.url, "node-a.1.1"), backend(redis_server.url, "node-b.1.2")
    yield a, b, Collect(a), Collect(b)
    a.close()
    b.close()


def test_a_response_learned_on_one_replica_is_applied_on_another_in_its_own_scope_only(pair):
    a, b, _, got = pair
    a.add(SHARED_SCOPE, np.array([1, 2, 3]))
    a.add(X, np.array([7, 8, 9]))
    assert got.has(SHARED_SCOPE, [1, 2, 3]) and got.has(X, [7, 8, 9])
    assert (Y, [7, 8, 9]) not in got.new and (SHARED_SCOPE, [7, 8, 9]) not in got.new
    assert len(got.new) == 2  # and a repeat is not appended again
    a.add(X, np.array([7, 8, 9]))
    time.sleep(0.5)
    got()
    assert len(got.new) == 2


def test_key_names_hold_no_salt_and_each_scope_has_its_own_stream(pair, redis_server):
    a, _, _, got = pair
    a.add(X, np.array([4, 5]))
    assert got.has(X, [4, 5])
    names = b" ".join(redis_server.client().keys())
    assert b"tenant-x" not in names and X.encode() in names


def test_a_start_catches_up_with_the_newest_records_within_its_bounds(redis_server):
    a = backend(redis_server.url, "node-a.1.1")
    for i in range(30):
        a.add(SHARED_SCOPE, np.array([i + 1, i + 2]))
    assert a.wait_idle()
    late = Collect(backend(redis_server.url, "node-c.1.3", max_responses=10))
    assert late.has(SHARED_SCOPE, [30, 31])
    time.sleep(0.3)
    late()
    assert len(late.new) == 10 and (SHARED_SCOPE, [1, 2]) not in late.new  # the newest 10
    a.close()
    late.b.close()


def test_a_corrupt_record_is_refused_naming_why_once_per_kind_and_the_rest_go_on(pair, redis_server, caplog):
    a, b, _, got = pair
    a.add(SHARED_SCOPE, np.array([1, 2]))
    assert got.has(SHARED_SCOPE, [1, 2])
    stream = b.keys.stream(SHARED_SCOPE)
    c = redis_server.client()
    with caplog.at_level(logging.WARNING, logger="freespec"):
        c.xadd(stream, {"t": np.array([5, 5000], dtype="<i4").tobytes(), "w": "x.1.1", "s": "1"})
        c.xadd(stream, {"t": np.array([5, 6000], dtype="<i4").tobytes(), "w": "x.1.1", "s": "1"})
        c.xadd(stream, {"t": b"abc", "w": "x.1.1", "s": "1"})
        c.xadd(stream, {"w": "x.1.1"})
        c.xadd(stream, {"t": np.array([5], dtype="<i4").tobytes(), "w": "x.1.1", "s": str(time.time_ns() + 10**13)})
        a.add(SHARED_SCOPE, np.array([3, 4]))
        assert got.has(SHARED_SCOPE, [3, 4])
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(set(refused)) == 4 and len(refused) <= 8 and b.refused == 5  # once per kind, by each replica
    assert any("token out of vocabulary" in m for m in refused) and any("missing field" in m for m in refused)
    assert all(5000 not in t and 6000 not in t for _, t in got.new)


def test_a_scope_purge_is_honoured_everywhere_and_never_written_back(pair, redis_server):
    from freespec.proposers.learned.redis_stream import purge_scope

    a, b, _, got = pair
    a.add(X, np.array([7, 8]))
    a.add(Y, np.array([9, 10]))
    assert got.has(X, [7, 8]) and got.has(Y, [9, 10])
    assert purge_scope(redis_server.url, X) == 1
    assert wait_until(lambda: (got(), X in got.forget)[1], 5)
    assert X not in b.held.held_scopes() and Y in b.held.held_scopes()
    assert wait_until(lambda: (a.take(), X not in a.held.held_scopes())[1], 5)
    # a writer that has not seen the purge yet (its known generation is the old one) writes nothing back
    stale = backend(redis_server.url, "node-s.1.4")
    stale._stop.set()
    stale._thread.join()
    stale._gens.clear()  # as if it had started before the purge and not read the log since
    stale._redis()
    stale._append(X, [(X, b"k" * 16, np.array([7, 8], dtype=np.int32), time.time_ns())])
    assert not redis_server.client().exists(b.keys.stream(X)), redis_server.client().xrange(b.keys.stream(X))
    assert stale.appended == 0
    # a later response of the scope is new learning, shared again
    a.add(X, np.array([11, 12]))
    assert got.has(X, [11, 12])


def test_a_purge_by_writer_is_dropped_from_every_replica_and_a_re_append_does_not_bring_it_back(pair, redis_server):
    from freespec.proposers.learned.redis_stream import purge

    a, b, _, got = pair
    a.add(SHARED_SCOPE, np.array([1, 2]))
    b.add(SHARED_SCOPE, np.array([3, 4]))
    assert got.has(SHARED_SCOPE, [1, 2])
    assert b.wait_idle()
    assert purge(redis_server.url, writer="node-a.1.1") == 1
    assert wait_until(lambda: (got(), got.rebuilds)[1], 5)
    assert got.rebuilds[-1] == [(SHARED_SCOPE, [3, 4])]
    assert wait_until(lambda: (a.take(), len(a.held) == 1)[1], 5)  # the writer itself dropped it too
    redis_server.client().delete(b.keys.stream(SHARED_SCOPE))  # a's stream gone: a appends what it holds
    assert wait_until(lambda: a.reappended or b.reappended, 5)
    time.sleep(0.3)
    values = [f[b"t"] for _, f in redis_server.client().xrange(b.keys.stream(SHARED_SCOPE))]
    assert np.array([1, 2], dtype="<i4").tobytes() not in values


def test_a_purge_in_whole_empties_every_replica_and_later_learning_is_kept(pair, redis_server):
    from freespec.proposers.learned.redis_stream import list_state, purge

    a, b, _, got = pair
    a.add(SHARED_SCOPE, np.array([1, 2]))
    a.add(X, np.array([3, 4]))
    assert got.has(X, [3, 4])
    assert sum(s.records for s in list_state(redis_server.url)) == 2
    assert purge(redis_server.url) == 2
    assert wait_until(lambda: (got(), a.take(), len(b.held) == 0 and len(a.held) == 0)[2], 5)
    a.add(SHARED_SCOPE, np.array([5, 6]))
    assert got.has(SHARED_SCOPE, [5, 6])


def test_redis_down_at_start_then_up_catches_up(tmp_path):
    server = RedisServer(tmp_path / "r")
    a, b = backend(server.url, "node-a.1.1"), backend(server.url, "node-b.1.2")
    got = Collect(b)
    a.add(SHARED_SCOPE, np.array([1, 2]))
    t = time.perf_counter()
    got()
    assert time.perf_counter() - t < 0.01  # nothing waits on Redis
    server.start()
    try:
        assert got.has(SHARED_SCOPE, [1, 2], timeout=15)
    finally:
        a.close()
        b.close()
        server.stop()


def test_redis_stopped_then_restarted_empty_each_replica_appends_again_what_it_holds(pair, redis_server, caplog):
    a, b, _, got = pair
    a.add(SHARED_SCOPE, np.array([1, 2]))
    assert got.has(SHARED_SCOPE, [1, 2])
    with caplog.at_level(logging.WARNING, logger="freespec"):
        redis_server.stop()
        a.add(SHARED_SCOPE, np.array([3, 4]))  # learned while Redis is down
        time.sleep(1.5)
        t = time.perf_counter()
        got()
        assert time.perf_counter() - t < 0.01
        redis_server.start()  # the same port, empty
        assert got.has(SHARED_SCOPE, [3, 4], timeout=15)
    late = Collect(backend(redis_server.url, "node-c.1.3"))
    assert late.has(SHARED_SCOPE, [1, 2], timeout=10)  # appended again from what a and b held
    late.b.close()
    faults = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert 1 <= len(faults) <= 2 * len(set(faults))  # once per kind, by each of the two replicas


def test_redis_paused_with_sigstop_no_request_waits_and_it_catches_up(pair, redis_server):
    a, b, _, got = pair
    a.add(SHARED_SCOPE, np.array([1, 2]))
    assert got.has(SHARED_SCOPE, [1, 2])
    redis_server.pause()
    try:
        slowest = 0.0
        for i in range(40):
            t = time.perf_counter()
            a.add(SHARED_SCOPE, np.array([10, i + 1]))
            got()
            slowest = max(slowest, time.perf_counter() - t)
            time.sleep(0.05)
        assert slowest < 0.05
    finally:
        redis_server.resume()
    assert got.has(SHARED_SCOPE, [10, 40], timeout=15)


def test_redis_at_maxmemory_refuses_appends_the_server_goes_on_and_catches_up(pair, redis_server, caplog):
    a, b, _, got = pair
    c = redis_server.client()
    a.add(SHARED_SCOPE, np.array([1, 2]))
    assert got.has(SHARED_SCOPE, [1, 2])
    with caplog.at_level(logging.WARNING, logger="freespec"):
        c.config_set("maxmemory", 1)
        a.add(SHARED_SCOPE, np.array([3, 4]))
        assert wait_until(lambda: any("OutOfMemoryError" in r.getMessage() for r in caplog.records), 5)
        got()
        assert (SHARED_SCOPE, [3, 4]) not in got.new
        c.config_set("maxmemory", 0)
        assert got.has(SHARED_SCOPE, [3, 4])
    assert sum("OutOfMemoryError" in r.getMessage() for r in caplog.records) == 1


def test_the_password_is_never_logged_nor_in_a_refusal(tmp_path, caplog, monkeypatch):
    from freespec.proposers.learned.redis_stream import check_url, redacted
    from freespec.vllm_plugins.adapter_options import adapter_options

    secret = "s3cr3t-pw-4242"
    server = RedisServer(tmp_path / "r", "--requirepass", secret).start()
    try:
        good = f"redis://:{secret}@127.0.0.1:{server.port}/0"
        bad = f"redis://:wrong-{secret}@127.0.0.1:{server.port}/0"
        with caplog.at_level(logging.DEBUG, logger="freespec"):
            a, b = backend(good, "node-a.1.1"), backend(bad, "node-b.1.2")
            a.add(SHARED_SCOPE, np.array([1, 2]))
            assert a.wait_idle()
            assert wait_until(lambda: any("failed" in r.getMessage() for r in caplog.records), 5)
            a.close()
            b.close()
        monkeypatch.setenv("FREESPEC_REDIS_PASSWORD", secret)
        c = backend(f"redis://127.0.0.1:{server.port}/0", "node-c.1.3")
        assert Collect(c).has(SHARED_SCOPE, [1, 2])  # the password from the environment
        c.close()
        for url in (f"redis://:{secret}@127.0.0.1/0", f"redis://:{secret}@127.0.0.1:1/x"):
            with pytest.raises(ValueError) as e:
                check_url(url)
            assert secret not in str(e.value)
            with pytest.raises(ValueError) as e:
                adapter_options({"state_dir": url})
            assert secret not in str(e.value)
        assert secret not in redacted(good) and "***" in redacted(good)
        assert adapter_options({"state_dir": good}).state_dir == good
        assert all(secret not in r.getMessage() for r in caplog.records)
    finally:
        server.stop()


# One replica process: the Redis backend of one writer, driven over stdin ("add SCOPE T..", "held SCOPE",
# "take", "close"), each command answered "ok ...".
REPLICA = """
import sys
import numpy as np
from freespec.proposers.learned.redis_stream import RedisResponses

b = RedisResponses(sys.argv[1], writer=sys.argv[2], fingerprint="sha256:tok-a", vocab_size=1000, max_responses=100,
                   max_tokens=100000)
print("ok", flush=True)
for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "add":
        b.add("" if args[0] == "-" else args[0], np.array([int(a) for a in args[1:]], dtype=np.int32))
    elif cmd == "take":
        got = b.take()
        print("ok", " ".join(("-" if s == "" else s) + ":" + ",".join(map(str, t.tolist())) for s, t in got.new),
              flush=True)
        continue
    elif cmd == "close":
        b.close()
        print("ok", flush=True)
        break
    print("ok", flush=True)
"""


class Replica(ScriptProcess):
    def __init__(self, url: str, writer: str) -> None:
        super().__init__(REPLICA, url, writer)
        self.seen: list[str] = []

    def sees(self, item: str, timeout: float = 10.0) -> bool:
        return bool(wait_until(lambda: (self.seen.extend(self.do("take").split()), item in self.seen)[1], timeout))

    def close(self) -> None:
        self.do("close")
        self.proc.wait(10)


def test_two_replica_processes_learn_from_each_other_through_redis(redis_server):
    one, two = Replica(redis_server.url, "node-1.1.1"), Replica(redis_server.url, "node-2.1.2")
    try:
        one.do("add - 1 2 3")
        two.do(f"add {X} 4 5 6")
        assert two.sees("-:1,2,3") and one.sees(f"{X}:4,5,6")
        assert not any(s.startswith(f"{X}:") for s in two.seen)  # its own are not applied back
    finally:
        one.close()
        two.close()


def test_the_suffix_source_drafts_on_one_replica_what_another_learned_through_redis(redis_server, monkeypatch):
    from freespec.proposers.learned import state_dir
    from freespec.proposers.base import EngineInfo, Row
    from freespec.proposers.suffix_tree import SuffixOptions, SuffixTreeProposer, available

    if not available()[0]:
        pytest.skip("needs arctic-inference")
    info = EngineInfo(vocab_size=1000, model="m", tokenizer_fingerprint=lambda: "sha256:tok-a",
                      state_dir=redis_server.url)
    one, two = SuffixTreeProposer(SuffixOptions(), 8), SuffixTreeProposer(SuffixOptions(), 8)
    monkeypatch.setattr(state_dir, "writer_id", lambda: "node-1.1.1")  # two replicas: one process each in a fleet
    one.bind(info)
    monkeypatch.setattr(state_dir, "writer_id", lambda: "node-2.1.2")
    two.bind(info)
    try:
        prompt, answer = np.arange(10, 20, dtype=np.int32), np.arange(500, 512, dtype=np.int32)
        seq = prompt
        for token in answer:  # as the engine feeds a request, then it leaves
            seq = np.append(seq, token).astype(np.int32)
            one.candidates([Row(key=1, tokens=seq, num_new=1)])
        one.release(1)
        context = np.array([1, 2, 3, 500, 501, 502], dtype=np.int32)

        def drafted():
            found = two.candidates([Row(key=99, tokens=context, num_new=len(context))])[0]
            two.release(99)
            return [] if found is None else [int(t) for t in found.chains[0] if t >= 0]

        assert wait_until(lambda: drafted()[:3] == [503, 504, 505], 10)
        salted = Row(key=7, tokens=context, num_new=len(context), scope=X)  # another scope drafts none of it
        assert two.candidates([salted])[0] is None
    finally:
        one.close()
        two.close()


def run_cli(argv: list[str]) -> int:
    from freespec.cli.main import main

    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)


@pytest.mark.parametrize("extra", [["--older-than", "nan"], ["--older-than", "-1"], ["--writer", "h.1"],
                                   ["--scope", ""], ["--scope", "t", "--writer", "h.1.10"]])
def test_state_purge_of_a_url_refuses_a_bad_argument_and_removes_nothing(pair, redis_server, capsys, extra):
    a, _, _, got = pair
    a.add(X, np.array([1, 2]))
    assert got.has(X, [1, 2])
    before = redis_server.client().xlen(a.keys.stream(X))
    assert run_cli(["state", "purge", redis_server.url, *extra]) in (1, 2)
    assert redis_server.client().xlen(a.keys.stream(X)) == before == 1


def test_state_list_and_purge_work_against_a_url(pair, redis_server, capsys):
    a, b, _, got = pair
    a.add(SHARED_SCOPE, np.array([1, 2]))
    a.add(X, np.array([3, 4]))
    b.add(SHARED_SCOPE, np.array([5, 6]))
    assert got.has(X, [3, 4]) and b.wait_idle()
    assert run_cli(["state", "list", redis_server.url]) == 0
    out = capsys.readouterr().out
    assert "2 stream(s), 3 records" in out and f"/{X}\t" in out and "/shared\t" in out
    assert run_cli(["state", "purge", redis_server.url, "--scope", "tenant-x"]) == 0
    assert "1 record(s) removed" in capsys.readouterr().out
    assert wait_until(lambda: (got(), X in got.forget)[1], 5)
    assert run_cli(["state", "purge", redis_server.url, "--writer", "node-a.1.1"]) == 0
    assert "1 record(s) removed" in capsys.readouterr().out
    assert run_cli(["state", "purge", redis_server.url]) == 0
    assert "1 record(s) removed" in capsys.readouterr().out


def test_state_against_a_url_whose_server_is_down_fails_naming_it_without_the_password(tmp_path, capsys):
    url = f"redis://:pw-s3cret@127.0.0.1:{RedisServer(tmp_path).port}/0"
    assert run_cli(["state", "list", url]) == 1
    err = capsys.readouterr().err
    assert "127.0.0.1" in err and "pw-s3cret" not in err
