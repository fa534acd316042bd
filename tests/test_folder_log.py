"""The folder backend as an append-only log (issue 87): each response appended once, readers read only the new
bytes, a torn last record waits for the next round, a writer's compaction never loses a reader's place, purges
take the text off the disk, and two real writer processes learn from each other."""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from script_process import ScriptProcess
from freespec import confined
from freespec.proposers.api import SHARED_SCOPE
from freespec.proposers.learned import state_purge
from freespec.proposers.learned.folder_log import EXT, FolderLog, segment_header, segment_name
from freespec.proposers.learned.scoped_responses import purge_scope
from freespec.vllm_plugins.request_ids import scope_of

FP = "sha256:tok-a"
X = scope_of("tenant-x")


@pytest.fixture
def folder(tmp_path):
    yield tmp_path
    confined.release(str(tmp_path))


def log(folder: Path, writer: str, **kw) -> FolderLog:
    kw = {"max_responses": 1000, "max_tokens": 100_000, "interval_s": 0, **kw}
    return FolderLog(str(folder), fingerprint=FP, vocab_size=1000, writer=writer, **kw)


def response(i: int, n: int = 50) -> np.ndarray:
    return (np.arange(n, dtype=np.int32) * 7 + i) % 1000


def new(backend: FolderLog) -> list[tuple[str, list[int]]]:
    return [(scope, t.tolist()) for scope, t in backend.take().new]


def segments(folder: Path, writer: str) -> list[Path]:
    return sorted(p for p in folder.rglob(f"*{EXT}") if segment_name(p.name)[0] == writer)


def test_each_response_is_appended_once_and_a_reader_reads_only_the_new_bytes(folder):
    a, b = log(folder, "host-a.1.1"), log(folder, "host-b.1.1")
    for i in range(20):
        a.add(SHARED_SCOPE, response(i))
    a.sync()
    size = sum(p.stat().st_size for p in segments(folder, "host-a.1.1"))
    b.sync()
    assert len(new(b)) == 20 and b.bytes_read == size  # its header and records, once
    first = b.bytes_read
    b.sync()
    assert b.bytes_read == first and new(b) == []  # nothing new: not a byte read
    a.add(SHARED_SCOPE, response(100))
    a.add(X, response(101))
    a.sync()
    b.sync()
    assert sorted(new(b)) == sorted([(SHARED_SCOPE, response(100).tolist()), (X, response(101).tolist())])
    # only the new bytes: the shared segment's new record, and the new scope segment (its header, its record)
    record = 16 + 4 * 50 + 8
    assert b.bytes_read - first == 2 * record + len(segment_header(FP, 1000, "host-a.1.1", X))
    a.sync()
    assert a.appended == 22  # appended once each, never rewritten
    a.close(), b.close()


def test_a_torn_last_record_is_read_at_the_next_round_not_refused(folder):
    a, b = log(folder, "host-a.1.1"), log(folder, "host-b.1.1")
    a.add(SHARED_SCOPE, response(1))
    a.add(SHARED_SCOPE, response(2))
    a.sync()
    (path,) = segments(folder, "host-a.1.1")
    whole = path.read_bytes()
    path.write_bytes(whole[:-100])  # the writer mid-append: the second record half there
    b.sync()
    assert new(b) == [(SHARED_SCOPE, response(1).tolist())] and b.refused == 0
    with open(path, "ab") as f:
        f.write(whole[-100:])
    b.sync()
    assert new(b) == [(SHARED_SCOPE, response(2).tolist())] and b.refused == 0
    a.close(), b.close()


def test_a_damaged_record_is_refused_naming_why_and_nothing_of_it_reaches_a_reader(folder, caplog):
    a, b = log(folder, "host-a.1.1"), log(folder, "host-b.1.1")
    a.add(X, response(1))
    a.sync()
    (path,) = segments(folder, "host-a.1.1")
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF  # a token's byte
    path.write_bytes(bytes(data))
    b.sync()
    assert new(b) == [] and b.refused == 1 and "checksum mismatch" in caplog.text
    a.close(), b.close()


def test_compaction_keeps_the_newest_within_the_bounds_and_a_reader_mid_file_loses_nothing(folder):
    a = log(folder, "host-a.1.1", max_responses=10, max_tokens=100_000)
    b = log(folder, "host-b.1.1", max_responses=10, max_tokens=100_000)
    for i in range(20):
        a.add(SHARED_SCOPE, response(i))
        if i % 10 == 9:
            a.sync()
    b.sync()  # the reader is mid-file, at the end of what was written so far
    assert len(new(b)) == 20 and a.compactions == 0  # (its bounds then keep the newest 10)
    for i in range(20, 25):
        a.add(SHARED_SCOPE, response(i))
    a.sync()  # 25 records: more than twice the bound, compacted into a fresh segment of the newest 10
    (path,) = segments(folder, "host-a.1.1")
    assert a.compactions == 1 and segment_name(path.name)[1] == 2
    b.sync()
    got = [t for _, t in new(b)]
    assert got == [response(i).tolist() for i in range(20, 25)]  # the rest read again, kept once
    a.add(SHARED_SCOPE, response(99))
    a.sync()
    b.sync()
    assert new(b) == [(SHARED_SCOPE, response(99).tolist())]
    a.close(), b.close()


def test_a_scope_purge_takes_its_text_off_the_disk_and_no_writer_writes_it_back(folder):
    a, b = log(folder, "host-a.1.1"), log(folder, "host-b.1.1")
    a.add(X, response(1))
    a.sync()
    b.sync()
    assert new(b) == [(X, response(1).tolist())]
    a.add(X, response(2))  # learned before the writer sees the purge
    purge_scope(str(folder / "suffix"), X)
    secret = response(2).astype("<i4").tobytes()
    a.sync(), b.sync()
    assert b.take().forget == [X] and a.take().forget == [X]
    on_disk = b"".join(p.read_bytes() for p in folder.rglob("*") if p.is_file())
    assert secret not in on_disk and response(1).astype("<i4").tobytes() not in on_disk
    a.add(X, response(3))  # learned after the purge: kept, under the new generation
    a.sync(), b.sync()
    assert new(b) == [(X, response(3).tolist())]
    a.close(), b.close()


@pytest.mark.parametrize("by", ["writer", "whole"])
def test_a_purge_by_writer_or_in_whole_takes_the_text_off_every_writers_segments(folder, by):
    a, b = log(folder, "host-a.1.1"), log(folder, "host-b.1.1")
    for i in range(5):
        a.add(SHARED_SCOPE, response(i))
    a.sync(), b.sync()
    assert len(new(b)) == 5
    state_purge.purge(str(folder), writer="host-a.1.1" if by == "writer" else None)
    a.sync(), b.sync()
    assert b.take().rebuild == [] and a.take().rebuild == []
    on_disk = b"".join(p.read_bytes() for p in folder.rglob(f"*{EXT}"))
    assert all(response(i).astype("<i4").tobytes() not in on_disk for i in range(5))
    a.add(SHARED_SCOPE, response(1))  # the same text again: kept only 5 minutes after the purge (the clock slack)
    a.add(SHARED_SCOPE, response(77))  # new text: kept after a purge by writer; within 5 minutes of a cutoff, not
    a.sync(), b.sync()
    assert new(b) == ([(SHARED_SCOPE, response(77).tolist())] if by == "writer" else [])
    a.close(), b.close()


def test_a_restarted_writer_catches_up_from_the_newest_segments_within_its_bounds(folder):
    a = log(folder, "host-a.1.1", max_responses=10)
    for i in range(15):
        a.add(X if i % 2 else SHARED_SCOPE, response(i))
    a.close()
    c = log(folder, "host-c.1.1", max_responses=4)
    shared = [t.tolist() for s, t in c.loaded if s == SHARED_SCOPE]
    assert shared == [response(i).tolist() for i in (8, 10, 12, 14)]
    assert len([s for s, _ in c.loaded if s == X]) == 4
    c.close()


def test_a_start_reads_the_newest_segments_and_follows_the_others_from_their_end(folder, monkeypatch):
    from freespec.proposers.learned import state_dir

    old, new_ = log(folder, "host-a.1.1"), log(folder, "host-b.1.1")
    old.add(SHARED_SCOPE, response(1))
    old.sync()
    os.utime(segments(folder, "host-a.1.1")[0], (1e9 + 0, time.time() - 60))  # written a minute ago
    new_.add(SHARED_SCOPE, response(2))
    new_.sync()
    monkeypatch.setattr(state_dir, "START_FILES", 1)
    c = log(folder, "host-c.1.1")
    assert [t.tolist() for _, t in c.loaded] == [response(2).tolist()]  # the newest segment only
    old.add(SHARED_SCOPE, response(3))
    old.sync()
    before = c.bytes_read
    c.sync()
    assert new(c) == [(SHARED_SCOPE, response(3).tolist())]  # the older one from where it ended: not its past
    assert c.bytes_read - before < 300
    for backend in (old, new_, c):
        backend.close()


WRITER = """
import sys
import numpy as np
from freespec.proposers.learned.folder_log import FolderLog

log = FolderLog(sys.argv[1], fingerprint="sha256:tok-a", vocab_size=1000, max_responses=1000,
                max_tokens=100000, interval_s=0.05)
print("ok", log.writer, flush=True)
for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "add":
        log.add(args[0] if args[0] != "-" else "", np.array([int(a) for a in args[1:]], dtype=np.int32))
        print("ok", flush=True)
    elif cmd == "got":
        print("ok", ";".join(f"{s or '-'}:{','.join(map(str, t.tolist()))}" for s, t in log.take().new), flush=True)
    elif cmd == "close":
        log.close()
        print("ok", flush=True)
        break
"""


def test_two_writer_processes_learn_from_each_other(folder):
    one, two = ScriptProcess(WRITER, str(folder)), ScriptProcess(WRITER, str(folder))
    try:
        one.do("add - 1 2 3 4")
        two.do(f"add {X} 5 6 7 8")
        deadline, got_one, got_two = time.monotonic() + 20, "", ""
        while time.monotonic() < deadline and not (got_one and got_two):
            got_one += one.do("got")
            got_two += two.do("got")
            time.sleep(0.05)
        assert got_one == f"{X}:5,6,7,8" and got_two == "-:1,2,3,4"
    finally:
        for p in (one, two):
            p.do("close")
            p.proc.wait(timeout=30)
    assert all(os.stat(p).st_mode & 0o777 == 0o600 for p in folder.rglob(f"*{EXT}"))
