"""The state directory as a trust boundary (issue 86): purges that stick on every replica whatever the order of
saves, stops and starts; no link below the folder followed; clocks that cannot keep a file alive or hide later
learning; starts bounded by the stores, not the folder; one file never shared by two writers.

Replicas are real processes (``REPLICA`` below: one writer's folder log, driven line by line over stdin), writing
and reading real files in one folder; a peer's segment is planted with ``plant`` where a test needs one written
by hand (another user's, dated ahead, of an older purge generation).
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from script_process import ScriptProcess
from scoped_helpers import plant
from freespec import confined
from freespec.proposers.learned import state_dir, state_purge
from freespec.proposers.api import EngineInfo
from freespec.proposers.learned.folder_log import EXT, FolderLog
from freespec.proposers.learned.purges import PurgeLog
from freespec.proposers.learned.scoped_responses import Tombstones, fingerprint_for, purge_scope
from freespec.vllm_plugins.request_ids import scope_of

REPO = Path(__file__).resolve().parents[1]
FP = "sha256:tok-a"
X, Y = scope_of("tenant-x"), scope_of("tenant-y")

# One replica: its folder log in <dir>; commands on stdin, one per line, each answered "ok ...".
REPLICA = """
import os, sys
import numpy as np
from freespec.proposers.learned import state_dir
from freespec.proposers.learned.folder_log import FolderLog

log = FolderLog(sys.argv[1], fingerprint="sha256:tok-a", vocab_size=1000, max_responses=1000, max_tokens=100000,
                max_age_s=86400.0, max_bytes=10**8, interval_s=0, writer=os.environ.get("WRITER") or None)
log.take()
print("ok", log.writer, flush=True)
for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "add":
        log.add(args[0], np.array([int(a) for a in args[1:]], dtype=np.int32))
    elif cmd == "save":  # one file round (append, purges, peers' new bytes), applied as the suffix source does
        for _ in range(3):
            log.sync()
            log.take()
    elif cmd == "held":
        print("ok", len(log.held.of(args[0])), flush=True)
        continue
    elif cmd == "close":
        log.close()
        print("ok", flush=True)
        break
    print("ok", flush=True)
"""


class Replica(ScriptProcess):
    def __init__(self, folder: Path, writer: str = "") -> None:
        super().__init__(REPLICA, str(folder), WRITER=writer)
        self.writer = self.greeting

    def held(self, scope: str) -> int:
        return int(self.do(f"held {scope}"))

    def close(self) -> None:
        self.do("close")
        self.proc.wait(timeout=30)


def stores_hold(folder: Path, scope: str) -> set[tuple[int, ...]]:
    """What a fresh writer loads of ``scope``, every segment of the folder read (in this process)."""
    log = FolderLog(str(folder), fingerprint=FP, vocab_size=1000, max_responses=1000, max_tokens=100000,
                    max_age_s=86400.0, max_bytes=10**8, interval_s=0, writer="reader.0.0")
    log.close()
    return {tuple(int(t) for t in r) for s, r in log.loaded if s == scope}


@pytest.fixture
def folder(tmp_path):
    yield tmp_path
    confined.release(str(tmp_path))


def test_a_purge_sticks_whatever_the_order_of_saves_stops_and_starts(folder):
    a, b = Replica(folder), Replica(folder)
    try:
        a.do(f"add {X} 5 6 7 8")
        a.do(f"add {Y} 9 9 9 9")
        a.do("save")
        b.do("save")
        assert b.held(X) == 1  # b merged what a learned of x
        purge_scope(str(folder / "suffix"), X)  # between a's saves: a still holds x in memory
        a.do(f"add {X} 5 6 7 9")  # and learns more of it before it sees the tombstone
        a.do("save")  # its next save: honours the purge first, never writes x back
        b.do("save")
        assert a.held(X) == 0 and b.held(X) == 0
        assert stores_hold(folder, X) == set()
        assert stores_hold(folder, Y) == {(9, 9, 9, 9)}  # another tenant untouched
        a.do(f"add {X} 1 2 3 4")  # learned after the purge: kept, and shared
        a.do("save")
        b.do("save")
        assert b.held(X) == 1 and stores_hold(folder, X) == {(1, 2, 3, 4)}
        # A holder stopping right after a purge writes nothing of it, and a later start loads none of it.
        purge_scope(str(folder / "suffix"), X)
        a.close()
        b.close()
        assert stores_hold(folder, X) == set()
        c = Replica(folder)
        assert c.held(X) == 0
        c.close()
    finally:
        for r in (a, b):
            r.proc.kill()


@pytest.mark.parametrize("by", ["writer", "age", "all"])
def test_a_purge_by_writer_or_age_sticks_on_replicas_that_merged_what_it_removed(folder, by):
    a, b = Replica(folder), Replica(folder)
    try:
        a.do(f"add {X} 5 6 7 8")
        a.do("save")
        b.do(f"add {Y} 1 1 1 1")
        b.do("save")
        assert b.held(X) == 1  # b read a's response
        time.sleep(0.05)  # every file and response older than the age purge's cutoff below
        gone = state_purge.purge(str(folder), writer=a.writer if by == "writer" else None,
                               older_than_s=0.01 if by == "age" else None)
        assert gone and (all(a.writer in p for p in gone) or by != "writer")
        b.do("save")  # b forgets it, and its next save does not write it back
        assert b.held(X) == 0
        assert stores_hold(folder, X) == set()
        assert stores_hold(folder, Y) == ({(1, 1, 1, 1)} if by == "writer" else set())
        b.do(f"add {X} 0 0 0 0")
        a.close()  # a, stopping, holds the old one still: its final save is filtered too
        b.close()
        # the same text learned again (beyond the clocks' slack: test_a_purge_record_drops...) is kept; new text
        # is kept by a purge by writer, and one by age or in whole drops what was learned within the slack too
        assert stores_hold(folder, X) == ({(0, 0, 0, 0)} if by == "writer" else set())
        c = Replica(folder)
        assert c.held(X) == (1 if by == "writer" else 0)
        c.close()
    finally:
        for r in (a, b):
            r.proc.kill()


def test_a_purge_record_drops_what_it_names_up_to_its_time_and_never_later_learning(folder):
    from freespec.proposers.learned import purges

    confined.confine(str(folder))
    now = time.time_ns()
    slack = purges.SLACK_NS
    purges.write_record(str(folder), digests=np.array([7, 9], dtype="<u8"), before_ns=now - 10**12)
    purges.write_record(str(folder), digests=np.array([7], dtype="<u8"), before_ns=now)
    purges.write_record(str(folder), before_ns=now - 2 * 10**12)  # by age: everything stamped before it
    p = PurgeLog(str(folder)).current()
    keys = np.array([7, 7, 9, 9, 8, 8], dtype="<u8")
    # each time taken a clock's slack later; learned after that, the same text is kept
    stamps = np.array([now + slack, now + slack + 1, now - 10**12 + slack, now - 10**12 + slack + 1,
                       now - 2 * 10**12 + slack - 1, now - 2 * 10**12 + slack])
    want = [True, False, True, False, True, False]
    assert p.drops(keys, stamps).tolist() == want
    (folder / "purged" / "junk.purge").write_bytes(b"FSPURGE1" + b"\0" * 7)  # damaged: skipped, the rest holds
    assert PurgeLog(str(folder)).current().drops(keys, stamps).tolist() == want
    # a record that says the future is held to its own date (re-dated to now when dated ahead too)
    ahead = purges.write_record(str(folder), before_ns=now + 100 * 365 * 86_400 * 10**9)
    os.utime(ahead, (time.time() + 10 * 86_400,) * 2)
    later = np.array([time.time_ns() + slack + 10**9])
    assert not PurgeLog(str(folder)).current().drops(np.array([1], dtype="<u8"), later).any()


def test_a_file_written_for_an_older_purge_generation_is_never_merged_and_is_removed(folder):
    root = folder / "suffix"
    a = Replica(folder)
    try:
        purge_scope(str(root), X)
        # A writer that had not seen the tombstone (a save racing the purge) writes x's text after it.
        stale = plant(root / X / f"late.0.1.1{EXT}", [[4, 4, 4, 4]])
        a.do("save")
        assert a.held(X) == 0 and not stale.exists()
        a.close()
    finally:
        a.proc.kill()


@pytest.mark.parametrize("planted", ["scope folder", "own file", "tombstone folder", "source folder"])
def test_links_planted_in_the_state_directory_are_never_followed(folder, tmp_path_factory, planted):
    outside = tmp_path_factory.mktemp("outside")
    secret = outside / "secret.bin"
    secret.write_bytes(b"not freespec's")
    root = folder / "suffix"
    root.mkdir(mode=0o700)
    (root / Y).mkdir(mode=0o700)
    plant(root / Y / f"peer.0.1.1{EXT}", [[3, 1, 4, 1, 5]])
    if planted == "scope folder":  # x's folder is y's: x must neither read y's text nor write into y's folder
        os.symlink(root / Y, root / X)
    elif planted == "tombstone folder":
        os.symlink(outside, root / "purged")
    elif planted == "source folder":
        (folder / "recycle").symlink_to(outside)
    if planted == "own file":  # at the file a start reads and its saves replace
        (root / X).mkdir(mode=0o700)
        (root / X / f"host-t.1.1.1{EXT}").symlink_to(secret)
    before = sorted(p.name for p in outside.iterdir())
    a = Replica(folder, writer="host-t.1.1")
    try:
        a.do(f"add {X} 7 7 7 7")
        a.do("save")
        assert a.held(X) <= 1 and a.held(Y) == 1
        if planted == "scope folder":
            assert sorted(p.name for p in (root / Y).iterdir()) == [f"peer.0.1.1{EXT}"]  # nothing written through
            assert a.held(X) == 1  # its own response only; y's not merged into x
        a.close()
    finally:
        a.proc.kill()
    assert secret.read_bytes() == b"not freespec's"
    assert sorted(p.name for p in outside.iterdir()) == before
    if planted == "tombstone folder":
        with pytest.raises(OSError):
            purge_scope(str(root), X)
        assert sorted(p.name for p in outside.iterdir()) == before


def test_a_peer_file_of_another_user_or_writable_by_others_is_refused_unless_trusted(folder, caplog):
    root = folder / "suffix"
    confined.confine(str(folder))
    peer = plant(root / X / f"peer.0.1.1{EXT}", [[8, 8, 8, 8]])
    os.chmod(peer, 0o666)
    assert stores_hold(folder, X) == set()
    assert "state_dir_trust_others" in caplog.text
    confined.confine(str(folder), trust_others=True)
    assert stores_hold(folder, X) == {(8, 8, 8, 8)}


def test_a_missing_state_directory_is_made_private_and_a_world_writable_one_is_warned_of(tmp_path, caplog):
    made = tmp_path / "new"
    state_dir.open_root(str(made))
    assert made.is_dir() and made.stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    state_dir.open_root(str(shared))
    state_dir.open_root(str(shared))
    assert caplog.text.count("can be written by users other than its owner") == 1
    for p in (made, shared):
        confined.release(str(p))


def test_files_dated_ahead_of_the_clock_neither_live_forever_nor_hide_later_learning(folder):
    root = folder / "suffix"
    confined.confine(str(folder))
    future = time.time() + 10 * 86_400
    peer = plant(root / X / f"peer.0.1.1{EXT}", [[2, 2, 2, 2]])
    os.utime(peer, (future, future))
    # a file dated ahead counts as expired: not merged, and the start's sweep removes it
    assert stores_hold(folder, X) == set() and not peer.exists()
    assert state_dir.age(future, time.time()) == float("inf")
    # a tombstone dated ahead ages from now on, and learning after it is kept (no clock decides a purge)
    purge_scope(str(root), X)
    mark = root / "purged" / X
    os.utime(mark, (future, future))
    generation = Tombstones(str(root)).read()[X]
    assert mark.stat().st_mtime <= time.time() + 1
    plant(root / X / f"later.0.1.1{EXT}", [[6, 6, 6, 6]], fingerprint=fingerprint_for(FP, generation))
    assert stores_hold(folder, X) == {(6, 6, 6, 6)}


def test_a_start_with_a_thousand_peer_files_reads_within_the_bounds(folder):
    from freespec.proposers.suffix_tree import SuffixOptions, SuffixTreeProposer, available

    if not available():
        pytest.skip("arctic-inference is not installed")
    root = folder / "suffix"
    confined.confine(str(folder))
    confined.makedirs(str(root))
    for i in range(1000):
        plant(root / f"peer.0.{i}.1{EXT}", [[i % 1000, j, 5, 6, 7] for j in range(30)])
    info = EngineInfo(vocab_size=1000, model="m", tokenizer_fingerprint=lambda: FP)
    p = SuffixTreeProposer(SuffixOptions(max_saved_responses=500, max_cached_requests=500), 4)
    started = time.perf_counter()
    p.bind(dataclasses.replace(info, state_dir=str(folder)))
    took = time.perf_counter() - started
    assert p._seeded <= 500 and len(p.learned.held) <= 500
    assert took < 3.0, took  # 64 segments of 30 responses at most, not 30,000 responses into the tree
    p.close()


TWO_WRITERS = """
import sys, time
import numpy as np
from freespec.proposers.learned.response_store import ResponseStore
store = ResponseStore(sys.argv[1], fingerprint="sha256:tok-a", vocab_size=1000)
try:
    store.load()
except ValueError as e:
    print("refused", e, flush=True)
    sys.exit(3)
print("writing", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_a_second_process_on_one_responses_path_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "responses.bin"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first = subprocess.Popen([sys.executable, "-c", TWO_WRITERS, str(path), "20"], stdout=subprocess.PIPE, text=True,
                             env=env)
    try:
        assert first.stdout.readline().strip() == "writing"
        second = subprocess.run([sys.executable, "-c", TWO_WRITERS, str(path), "0"], capture_output=True, text=True,
                                env=env, timeout=60)
        assert second.returncode == 3, second.stderr
        assert str(path) in second.stdout and "state_dir" in second.stdout
    finally:
        first.kill()
        first.wait()
    third = subprocess.run([sys.executable, "-c", TWO_WRITERS, str(path), "0"], capture_output=True, text=True,
                           env=env, timeout=60)
    assert third.returncode == 0 and "writing" in third.stdout  # the first is gone: its lock with it


def test_a_running_suffix_source_drafts_nothing_more_from_what_a_purge_by_writer_removed(folder, monkeypatch):
    from freespec.proposers.api import Row
    from freespec.proposers.suffix_tree import SuffixOptions, SuffixTreeProposer, available

    if not available():
        pytest.skip("arctic-inference is not installed")
    info = EngineInfo(vocab_size=1000, model="m", tokenizer_fingerprint=lambda: FP, state_dir=str(folder))
    answer = np.arange(600, 620, dtype=np.int32)
    kept = np.arange(700, 720, dtype=np.int32)

    def source(writer: str) -> SuffixTreeProposer:
        monkeypatch.setattr(state_dir, "writer_id", lambda: writer)
        p = SuffixTreeProposer(SuffixOptions(min_token_prob=0.0, save_every_s=0.01), 4)
        p.bind(info)
        return p

    def drafts(p, context, key):
        out = p.propose([Row(key, np.asarray(context, dtype=np.int32), 1, "")])[0]
        p.release(key)
        return out

    first = source("host-a.1.1")
    first.learned.add("", answer)
    first.close()
    running = source("host-b.1.1")  # loaded what a learned, and learns on
    running.learned.add("", kept)
    running._seed([kept])
    assert drafts(running, [9, *answer[:6]], 1)[:3] == answer[6:9].tolist()
    state_purge.purge(str(folder), writer="host-a.1.1")
    deadline = time.monotonic() + 10
    while not running.learned._purge_applied:  # its thread reads the record; the engine's thread applies it
        running.candidates([])
        time.sleep(0.01)
        if time.monotonic() > deadline:
            raise AssertionError("the purge was not seen")
    while running.idle():
        pass
    assert drafts(running, [9, *answer[:6]], 2) == []
    assert drafts(running, [9, *kept[:6]], 3)[:3] == kept[6:9].tolist()  # the rest is kept
    running.close()
    fresh = source("host-c.1.1")
    assert drafts(fresh, [9, *answer[:6]], 4) == [] and drafts(fresh, [9, *kept[:6]], 5)[:1] == kept[6:7].tolist()
    fresh.close()


def test_a_tombstone_dated_ahead_survives_a_start_and_the_purge_holds(folder):
    a = Replica(folder)
    try:
        a.do(f"add {X} 5 6 7 8")
        a.do("save")
        purge_scope(str(folder / "suffix"), X)
        future = time.time() + 3600
        os.utime(folder / "suffix" / "purged" / X, (future, future))  # a purging host's clock an hour ahead
        c = Replica(folder)  # its start sweeps old tombstones: this one is re-dated, not taken for old
        assert (folder / "suffix" / "purged" / X).exists()
        a.do("save")
        a.close()
        c.do("save")
        assert c.held(X) == 0 and stores_hold(folder, X) == set()
        c.close()
    finally:
        a.proc.kill()


def test_a_peers_clock_ahead_lets_nothing_escape_a_purge(folder):
    root = folder / "suffix"
    confined.confine(str(folder))
    confined.makedirs(str(root / X))
    # a writer whose clock runs 250 s ahead (the bound: 300 s)
    plant(root / X / f"fast.0.1.1{EXT}", [[4, 4, 4, 4]], stamp_ns=time.time_ns() + 250 * 10**9)
    a = Replica(folder)
    try:
        a.do("save")  # reads the fast peer's record
        a.do(f"add {X} 5 6 7 8")
        a.do("save")
        state_purge.purge(str(folder))  # in whole
        a.do("save")
        assert a.held(X) == 0
        a.close()
        assert stores_hold(folder, X) == set()
    finally:
        a.proc.kill()


def test_a_folder_planted_in_a_scope_stops_no_purge(folder, caplog):
    a = Replica(folder)
    try:
        a.do(f"add {X} 5 6 7 8")
        a.do("save")
        (folder / "suffix" / X / "zzz").mkdir()
        purge_scope(str(folder / "suffix"), X)  # the tombstone first; what cannot be removed is named and left
        assert (folder / "suffix" / "purged" / X).exists() and "zzz" in caplog.text
        a.do("save")
        assert a.held(X) == 0
        a.close()
        assert stores_hold(folder, X) == set()
    finally:
        a.proc.kill()


@pytest.mark.parametrize("ahead_s, purge", [(0, {"writer": "host-a.1.1"}), (200, {})],
                         ids=["by writer", "a row stamped 200 s ahead, in whole"])
def test_recycle_rows_a_purge_removed_are_cleared_and_never_merged_back(folder, monkeypatch, ahead_s, purge):
    from freespec.proposers.api import Row, ScoredPositions
    from freespec.proposers.recycle.proposer import RecycleOptions, RecycleProposer

    info = EngineInfo(vocab_size=1000, model="m", tokenizer_fingerprint=lambda: FP, state_dir=str(folder))

    def source(writer: str, **options) -> RecycleProposer:
        monkeypatch.setattr(state_dir, "writer_id", lambda: writer)
        p = RecycleProposer(RecycleOptions(adaptive=False, **options), 4)
        p.bind(info)
        return p

    def first_draft(p: RecycleProposer, key: int) -> list[int]:
        return p.propose([Row(key, np.asarray([3, 4, 5], dtype=np.int32), 1)])[0][:1]

    first = source("host-a.1.1")
    ids = np.asarray([[421, 422]], dtype=np.int32)
    first.observe(ScoredPositions(np.asarray([5], dtype=np.int32), ids, np.full(ids.shape, 0.9, np.float32)))
    if ahead_s:
        first.matrix.stamps[5] = int(time.time()) + ahead_s  # a writer whose clock runs ahead
    first.close()
    second = source("host-b.1.1", save_every_s=0.01)  # merged the row
    assert first_draft(second, 1) == [421]
    state_purge.purge(str(folder), **purge)
    second._purges.current()  # as its background thread reads it
    second._last_save = 0.0
    second._files_tick()
    assert first_draft(second, 2) != [421]
    second.close()
    third = source("host-c.1.1")
    assert first_draft(third, 3) != [421]
    third.close()
