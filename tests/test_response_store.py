"""The response store: bounds, atomic saves, refused files, the replicas' merge, saving off the caller's thread."""
import hashlib
import itertools
import logging
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from freespec.proposers.learned import response_store as rs
from freespec.proposers.learned.response_store import ResponseStore, ResponseStoreError, Stored, merge

FP = "sha256:test-vocab"
VOCAB = 1000


def store(tmp_path, name="responses.bin", **kw) -> ResponseStore:
    kw.setdefault("fingerprint", FP)
    kw.setdefault("vocab_size", VOCAB)
    return ResponseStore(str(tmp_path / name), **kw)


def as_lists(responses) -> list[list[int]]:
    return [r.tolist() for r in responses]


def saved(tmp_path, responses, name="responses.bin", **kw) -> str:
    s = store(tmp_path, name, **kw)
    for r in responses:
        s.add(r)
    s.close()
    return s.path


def entry(stamp: int, tokens) -> rs._Entry:
    arr = np.asarray(tokens, dtype=np.int32)
    return rs._Entry(stamp, rs._digest(arr), arr)


# ---------------------------------------------------------------- bounds
def test_adding_more_than_max_responses_keeps_the_newest(tmp_path):
    s = store(tmp_path, max_responses=3)
    for i in range(10):
        s.add([i, i + 1])
    assert as_lists(s.responses()) == [[7, 8], [8, 9], [9, 10]]
    assert len(s) == 3 and s.num_tokens == 6


def test_adding_more_than_max_tokens_keeps_the_newest_and_cuts_a_long_response(tmp_path):
    s = store(tmp_path, max_tokens=10)
    s.add(list(range(4)))
    s.add(list(range(10, 14)))
    s.add(list(range(20, 24)))  # 12 tokens: the oldest goes
    assert as_lists(s.responses()) == [list(range(10, 14)), list(range(20, 24))]
    s.add(list(range(100, 125)))  # longer than max_tokens: its first 10 tokens, alone
    assert as_lists(s.responses()) == [list(range(100, 110))]
    assert s.num_tokens == 10


def test_a_response_added_again_is_kept_once_as_the_newest(tmp_path):
    s = store(tmp_path, max_responses=2)
    s.add([1, 2])
    s.add([3, 4])
    s.add([1, 2])
    s.add([5, 6])  # evicts [3, 4], the oldest now
    assert as_lists(s.responses()) == [[1, 2], [5, 6]]


def test_add_copies_and_refuses_ids_outside_the_vocabulary(tmp_path):
    s = store(tmp_path)
    buf = np.array([5, 6, 7], dtype=np.int64)
    assert s.add(buf)
    buf[:] = 0  # the caller reusing its buffer does not change what was kept
    assert as_lists(s.responses()) == [[5, 6, 7]]
    assert not s.add([])
    for bad in ([VOCAB], [-1], [2**32 + 5]):
        with pytest.raises(ValueError, match="token ids"):
            s.add(bad)
    assert len(s) == 1


def test_memory_stays_within_the_stated_bound(tmp_path):
    s = store(tmp_path, max_responses=2000, max_tokens=20_000)
    rng = np.random.default_rng(0)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(5000):
            s.add(rng.integers(0, VOCAB, size=int(rng.integers(1, 12))))
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(s) == 2000 or s.num_tokens > 20_000 - 12
    assert used <= s.max_bytes(), (used, s.max_bytes())


def test_options_out_of_range_are_refused(tmp_path):
    with pytest.raises(ValueError, match="max_responses"):
        store(tmp_path, max_responses=0)
    with pytest.raises(ValueError, match="max_tokens"):
        store(tmp_path, max_tokens=rs.MAX_TOKENS + 1)
    with pytest.raises(ValueError, match="does not exist"):
        ResponseStore(str(tmp_path / "missing" / "r.bin"), fingerprint=FP, vocab_size=VOCAB)


# ---------------------------------------------------------------- saving and loading
def test_close_saves_and_the_next_store_loads_oldest_first(tmp_path):
    path = saved(tmp_path, [[1, 2, 3], [4], [5, 6]])
    nxt = store(tmp_path)
    assert as_lists(nxt.load()) == [[1, 2, 3], [4], [5, 6]]
    assert as_lists(nxt.responses()) == [[1, 2, 3], [4], [5, 6]]
    assert os.path.getsize(path) == rs.file_bytes(3, 6, FP) <= nxt.max_file_bytes()
    nxt.add([7])  # newer than everything loaded
    assert as_lists(nxt.responses())[-1] == [7]


def test_load_without_a_file_starts_empty_and_close_is_idempotent(tmp_path):
    s = store(tmp_path)
    assert s.load() == []
    s.add([1])
    s.close()
    s.close()
    s.save_async()  # after close: nothing
    assert s.saves == 1


def test_save_async_writes_in_a_background_thread_and_add_does_no_io(tmp_path, monkeypatch):
    writers = []
    real = rs.write_store

    def recording(*a, **kw):
        writers.append(threading.current_thread())
        return real(*a, **kw)

    monkeypatch.setattr(rs, "write_store", recording)
    s = store(tmp_path)
    for i in range(50):
        s.add([i])
    assert writers == [] and not os.path.exists(s.path)
    s.save_async()
    assert s.wait_files(10)
    assert len(writers) == 1 and writers[0] is not threading.main_thread()
    assert len(store(tmp_path).load()) == 50
    s.close()
    assert writers[-1] is threading.main_thread()  # the final save, in the caller's thread at exit


def test_saves_requested_while_one_runs_are_coalesced_into_the_latest(tmp_path, monkeypatch):
    gate, started, written = threading.Event(), threading.Event(), []
    real = rs.write_store

    def slow(path, stored, **kw):
        started.set()
        gate.wait(10)
        written.append(len(stored.entries))
        return real(path, stored, **kw)

    monkeypatch.setattr(rs, "write_store", slow)
    s = store(tmp_path)
    s.add([1])
    s.save_async()
    assert started.wait(10)
    for i in range(2, 6):  # while the first save blocks: four requests, one slot
        s.add([i])
        s.save_async()
    gate.set()
    assert s.wait_files(10)
    assert written == [1, 5]
    s.close()


def test_a_store_that_did_not_change_is_not_written_again_and_a_failed_save_is_retried(tmp_path, monkeypatch):
    written, fail = [], []
    real = rs.write_store

    def recording(path, stored, **kw):
        if fail:
            raise OSError(28, "No space left on device")
        written.append(len(stored.entries))
        return real(path, stored, **kw)

    peer = saved(tmp_path, [[7, 8]], name="peer.bin")
    monkeypatch.setattr(rs, "write_store", recording)
    s = store(tmp_path)
    s.add([1])
    s.save_async()
    assert s.wait_files(10) and written == [1]
    mtime = os.stat(s.path).st_mtime_ns
    for _ in range(3):  # an idle server's ticks: nothing written, the file (and its mtime, peers' cue) as it was
        s.save_async()
        assert s.wait_files(10)
    assert written == [1] and os.stat(s.path).st_mtime_ns == mtime
    s.add([2])
    fail.append(True)
    s.save_async()  # fails: the next tick writes again though nothing changed since
    assert s.wait_files(10) and written == [1]
    fail.clear()
    s.save_async()
    assert s.wait_files(10) and written == [1, 2]
    s.merge_async([peer])
    assert not s.wait_files(10)  # the peer's store waits in its slot for the caller
    assert as_lists(s.take_merged()) == [[7, 8]]
    s.save_async()  # a merge is a change
    assert s.wait_files(10) and written == [1, 2, 3]
    s.evict_oldest()  # and so is an eviction
    s.save_async()
    assert s.wait_files(10) and written == [1, 2, 3, 2]
    echo = str(tmp_path / "echo.bin")  # a peer that merged this store's file and learned nothing since
    shutil.copyfile(s.path, echo)
    s.merge_async([echo])
    s.wait_files(10)
    assert s.take_merged() == []
    s.save_async()  # not a change: two idle replicas do not rewrite their files for each other
    assert s.wait_files(10) and written == [1, 2, 3, 2]
    s.close()


def test_the_file_mode_follows_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        path = saved(tmp_path, [[1]])
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o640


def test_a_failed_rename_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = saved(tmp_path, [[1, 2]])
    s = store(tmp_path)
    s.load()
    s.add([3, 4])

    def fail(src, dst, **kw):
        raise OSError("disk gone")

    monkeypatch.setattr(rs.os, "replace", fail)
    s.close()  # logged, not raised
    assert unlocked(os.listdir(tmp_path)) == [os.path.basename(path)]
    assert as_lists(store(tmp_path).load()) == [[1, 2]]


def test_a_crash_between_temporary_write_and_rename_leaves_the_old_file(tmp_path):
    path = saved(tmp_path, [[1, 2]])
    # A process killed after writing and fsyncing the temporary file, before the rename.
    code = (
        "import os, sys\n"
        "from freespec.proposers.learned import response_store as rs\n"
        "rs.os.replace = lambda src, dst, **kw: os._exit(17)\n"
        f"s = rs.ResponseStore({path!r}, fingerprint={FP!r}, vocab_size={VOCAB})\n"
        "s.load(); s.add([3, 4]); s.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 17, done.stderr
    temps = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert len(temps) == 1  # the crash left its temporary file written ...
    assert as_lists(store(tmp_path).load()) == [[1, 2]]  # ... and the old file untouched
    assert unlocked(os.listdir(tmp_path)) == [os.path.basename(path)]  # the next start removed the dead writer's file


def unlocked(names: list[str]) -> list[str]:
    """A folder's names but the lock file a loaded store holds (``claim_file``)."""
    return [n for n in names if not n.endswith(".lock")]


def test_load_keeps_a_temporary_file_of_a_live_writer(tmp_path):
    path = saved(tmp_path, [[1]])
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        other = tmp_path / f".responses.bin.{live.pid}.abcd.tmp"
        other.write_bytes(b"being written")
        unrelated = tmp_path / ".other.bin.1.abcd.tmp"
        unrelated.write_bytes(b"another store's")
        store(tmp_path).load()
        assert sorted(unlocked(os.listdir(tmp_path))) == sorted([os.path.basename(path), other.name, unrelated.name])
    finally:
        live.kill()
        live.wait()


# ---------------------------------------------------------------- refused files
def refused(path, **kw) -> ResponseStoreError:
    kw.setdefault("fingerprint", FP)
    kw.setdefault("vocab_size", VOCAB)
    s = ResponseStore(str(path), **kw)
    with pytest.raises(ResponseStoreError) as info:
        s.load()
    assert str(path) in str(info.value)
    return info.value


def test_a_corrupt_file_is_refused_by_its_checksum(tmp_path):
    path = saved(tmp_path, [[1, 2, 3], [4, 5]])
    data = bytearray(Path(path).read_bytes())
    data[-rs.CHECKSUM_BYTES - 3] ^= 0x01  # a bit of the last token
    Path(path).write_bytes(bytes(data))
    e = refused(path)
    assert e.reason == rs.CORRUPT and "checksum" in str(e)


@pytest.mark.parametrize("keep", [0, 5, rs.HEADER_BYTES, -1])
def test_a_truncated_file_is_refused(tmp_path, keep):
    path = saved(tmp_path, [[1, 2, 3], [4, 5]])
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[:keep])
    assert refused(path).reason == rs.TRUNCATED


def test_trailing_bytes_are_refused(tmp_path):
    path = saved(tmp_path, [[1, 2]])
    with open(path, "ab") as f:
        f.write(b"\0")
    assert refused(path).reason == rs.CORRUPT


def test_a_file_of_another_tokenizer_or_vocabulary_is_refused(tmp_path):
    path = saved(tmp_path, [[1, 2]])
    e = refused(path, fingerprint="sha256:other")
    assert e.reason == rs.FOREIGN and "sha256:other" in str(e) and FP in str(e)
    assert refused(path, vocab_size=VOCAB + 1).reason == rs.FOREIGN


def test_a_file_beyond_the_bounds_is_refused_naming_the_option(tmp_path):
    path = saved(tmp_path, [[1, 2], [3, 4], [5, 6]])
    e = refused(path, max_responses=2)
    assert e.reason == rs.OVERSIZE and "max_responses 2" in str(e)
    assert refused(path, max_tokens=5).reason == rs.OVERSIZE


def test_other_files_are_not_read_as_stores(tmp_path):
    path = tmp_path / "responses.bin"
    np.savez(path.open("wb"), tokens=np.arange(4))
    assert refused(path).reason == rs.NOT_A_STORE
    path.write_text("hello\n")
    assert refused(path).reason == rs.NOT_A_STORE


def test_another_format_version_is_refused(tmp_path):
    path = saved(tmp_path, [[1]])
    data = bytearray(Path(path).read_bytes())
    data[8:12] = struct.pack("<I", rs.VERSION + 1)
    Path(path).write_bytes(bytes(data))
    assert refused(path).reason == rs.UNSUPPORTED


def rechecksummed(path, data: bytearray) -> None:
    body = bytes(data[: -rs.CHECKSUM_BYTES])
    Path(path).write_bytes(body + hashlib.sha256(body).digest())


def test_a_crafted_file_with_a_good_checksum_is_still_checked(tmp_path):
    path = saved(tmp_path, [[1, 2, 3]])
    data = bytearray(Path(path).read_bytes())
    data[-rs.CHECKSUM_BYTES - 4 : -rs.CHECKSUM_BYTES] = struct.pack("<i", VOCAB)  # an id outside the vocabulary
    rechecksummed(path, data)
    e = refused(path)
    assert e.reason == rs.CORRUPT and "vocabulary" in str(e)
    path = saved(tmp_path, [[1, 2, 3]], name="lengths.bin")
    data = bytearray(Path(path).read_bytes())
    at = rs.HEADER_BYTES + len(FP)
    data[at : at + 4] = struct.pack("<I", 2)  # lengths no longer add up to the token count
    rechecksummed(path, data)
    assert refused(path).reason == rs.CORRUPT


def test_a_header_claiming_a_huge_store_is_refused_before_reading_on(tmp_path):
    path = saved(tmp_path, [[1, 2]])
    data = bytearray(Path(path).read_bytes())
    data[24:40] = struct.pack("<QQ", 2**40, 2**50)
    Path(path).write_bytes(bytes(data))
    assert refused(path).reason == rs.OVERSIZE


# ---------------------------------------------------------------- merging replicas
def key(stored: Stored) -> tuple:
    return [(e.stamp, e.tokens.tolist()) for e in stored.entries], stored.horizon


def test_merge_keeps_one_copy_of_each_response_and_the_newest_within_the_bounds():
    a = Stored([entry(10, [1]), entry(30, [2]), entry(50, [3, 3])])
    b = Stored([entry(20, [4]), entry(40, [2]), entry(60, [5])])
    entries, horizon = key(merge(a, b, max_responses=3, max_tokens=100))
    assert entries == [(40, [2]), (50, [3, 3]), (60, [5])] and horizon == b.entries[0].key
    entries, horizon = key(merge(a, b, max_responses=10, max_tokens=2))
    assert entries == [(60, [5])] and horizon == a.entries[2].key  # [3, 3] does not fit beside it: it and older go
    entries, horizon = key(merge(a, b, max_responses=10, max_tokens=100))
    assert [stamp for stamp, _ in entries] == [10, 20, 40, 50, 60] and horizon == rs.NO_HORIZON  # [2] once


def test_what_a_replica_evicted_does_not_come_back_from_an_older_file():
    a = Stored([entry(30, [2]), entry(40, [3])], horizon=entry(20, [1]).key)  # it evicted [1] at stamp 20
    b = Stored([entry(10, [7]), entry(20, [1]), entry(25, [8])])
    entries, horizon = key(merge(a, b, max_responses=10, max_tokens=100))
    assert entries == [(25, [8]), (30, [2]), (40, [3])] and horizon == a.horizon


def test_merge_is_commutative_associative_and_idempotent():
    rng = np.random.default_rng(1)
    pool = [[int(t) for t in rng.integers(0, 5, size=int(rng.integers(1, 4)))] for _ in range(12)]

    def replica():
        entries = [entry(int(rng.integers(1, 40)), pool[int(rng.integers(0, len(pool)))]) for _ in range(6)]
        cut = int(rng.integers(0, 12))  # a horizon: the replica evicted what is older
        return merge(Stored([e for e in entries if e.stamp > cut], (cut, b"")), Stored([]), 6, 100)

    for _ in range(30):
        a, b, c = replica(), replica(), replica()
        for bounds in [(4, 100), (100, 7), (3, 6)]:

            def m(x, y, bounds=bounds):
                return merge(x, y, *bounds)

            assert key(m(a, b)) == key(m(b, a))
            assert key(m(m(a, b), c)) == key(m(a, m(b, c)))
            ab = m(a, b)
            assert key(m(ab, ab)) == key(ab) == key(m(ab, a))


def test_merge_from_adds_a_replicas_responses_and_returns_the_new_ones(tmp_path):
    peer = saved(tmp_path, [[1, 2], [3], [4, 5]], name="peer.bin")
    s = store(tmp_path)
    s.add([3])  # also the peer's, added later here
    s.add([9])
    assert as_lists(s.merge_from(peer)) == [[1, 2], [4, 5]]
    assert as_lists(s.responses()) == [[1, 2], [4, 5], [3], [9]]
    assert s.merge_from(peer) == []  # merging again changes nothing
    assert s.merge_from(str(tmp_path / "not-yet.bin")) == []
    e = pytest.raises(ResponseStoreError, s.merge_from, saved(tmp_path, [[1]], name="other.bin",
                                                              fingerprint="sha256:x")).value
    assert e.reason == rs.FOREIGN


def test_replicas_merge_in_the_background_and_a_bad_peer_is_logged_once(tmp_path, caplog):
    good = saved(tmp_path, [[1, 2], [3]], name="good.bin")
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"garbage")
    s = store(tmp_path)
    s.add([7])
    peers = [good, str(bad), s.path, str(tmp_path / "missing.bin")]  # its own path and a missing one: skipped
    with caplog.at_level(logging.WARNING, logger="freespec"):
        s.merge_async(peers)
        assert not s.wait_files(10)  # the good peer's store waits in its slot for the caller
        assert as_lists(s.take_merged()) == [[1, 2], [3]]
        assert s.wait_files(10)
        s.merge_async(peers)
        assert s.wait_files(10)
        assert s.take_merged() == []  # an unchanged file is not read again; the bad one not logged again
    assert as_lists(s.responses()) == [[1, 2], [3], [7]]
    warnings = [r for r in caplog.records if "bad.bin" in r.getMessage()]
    assert len(warnings) == 1 and "not a response store" in warnings[0].getMessage()
    s.close()


# ---------------------------------------------------------------- failures never reach the caller
def test_a_failed_save_is_logged_once_and_never_raised(tmp_path, monkeypatch, caplog):
    def fail(*a, **kw):
        raise OSError(28, "No space left on device")

    real = rs.write_store
    monkeypatch.setattr(rs, "write_store", fail)
    s = store(tmp_path)
    s.add([1])
    with caplog.at_level(logging.INFO, logger="freespec"):
        for _ in range(3):
            s.save_async()
            assert s.wait_files(10)
        monkeypatch.setattr(rs, "write_store", real)
        s.close()
    failures = [r for r in caplog.records if "could not save" in r.getMessage()]
    assert len(failures) == 1 and "No space left" in failures[0].getMessage()
    assert any("saved to" in r.getMessage() and "again" in r.getMessage() for r in caplog.records)
    assert as_lists(store(tmp_path).load()) == [[1]]


def test_a_save_to_a_removed_folder_is_logged_not_raised(tmp_path, caplog):
    folder = tmp_path / "gone"
    folder.mkdir()
    s = ResponseStore(str(folder / "r.bin"), fingerprint=FP, vocab_size=VOCAB)
    s.add([1])
    folder.rmdir()
    with caplog.at_level(logging.WARNING, logger="freespec"):
        s.save_async()
        assert s.wait_files(10)
        s.close()
    assert len([r for r in caplog.records if "could not save" in r.getMessage()]) == 1


def test_adds_while_saving_from_another_thread_lose_nothing(tmp_path):
    s = store(tmp_path, max_responses=100_000, max_tokens=1_000_000)
    stop = threading.Event()

    def saver():
        while not stop.is_set():
            s.save_async()

    t = threading.Thread(target=saver)
    t.start()
    try:
        for i, j in itertools.product(range(50), range(20)):
            s.add([i, j])
    finally:
        stop.set()
        t.join()
    s.close()
    assert len(store(tmp_path, max_responses=100_000, max_tokens=1_000_000).load()) == 1000


def test_two_replicas_merging_each_others_files_hold_the_same_responses(tmp_path):
    a = store(tmp_path, "a.bin", max_responses=3)
    b = store(tmp_path, "b.bin", max_responses=3)
    for s, tokens in [(a, [1]), (b, [2]), (a, [3]), (b, [4]), (a, [4])]:
        s.add(tokens)
    a.close()
    b.close()
    a2, b2 = store(tmp_path, "a.bin", max_responses=3), store(tmp_path, "b.bin", max_responses=3)
    a2.load()
    b2.load()
    a2.merge_from(b.path)
    b2.merge_from(a.path)
    assert as_lists(a2.responses()) == as_lists(b2.responses()) == [[2], [3], [4]]


def test_adds_and_evictions_between_a_background_merge_and_its_take_are_kept(tmp_path):
    peer = saved(tmp_path, [[8]], name="peer.bin")  # older than everything added below
    s = store(tmp_path, max_responses=3)
    s.add([1])
    s.merge_async([peer])
    assert not s.wait_files(10)  # merged in the background against [1] alone
    s.add([5])
    assert as_lists(s.take_merged()) == [[8]]
    assert as_lists(s.responses()) == [[8], [1], [5]]

    s2 = store(tmp_path, "s2.bin", max_responses=3)
    s2.add([1])
    s2.add([2])
    s2.merge_async([peer])
    assert not s2.wait_files(10)
    s2.add([3])
    s2.add([4])  # evicts [1] here: it and the older [8] must not come back with the merge
    assert s2.take_merged() == []
    assert as_lists(s2.responses()) == [[2], [3], [4]]


def test_a_peer_clock_ahead_does_not_make_later_adds_older(tmp_path):
    ahead = entry(time.time_ns() + 2 * 10**11, [7])  # a replica whose clock is 200 s ahead (the bound: 300 s)
    peer = str(tmp_path / "peer.bin")
    rs.write_store(peer, Stored([ahead]), fingerprint=FP, vocab_size=VOCAB)
    s = store(tmp_path)
    s.add([1])
    s.merge_async([peer])
    assert not s.wait_files(10)
    s.add([5])  # added before the merge is taken: it stays newer than the peer's response
    assert as_lists(s.take_merged()) == [[7]]
    s.add([6])
    assert as_lists(s.responses()) == [[1], [7], [5], [6]]
    s.close()  # and the file stays in order: the next start reads it back as it was
    assert as_lists(store(tmp_path).load()) == [[1], [7], [5], [6]]
