"""A served datastore whose files change under it, and manifests crafted to escape the directory (issue 19).

The truncation tests run the proposer in a child process: a memory-mapped file truncated under a
mapping kills the process with SIGBUS (exit -7 here), which no ``pytest.raises`` can catch.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from test_retrieval import FP, write_store

from freespec.proposers.retrieval.datastore import MANIFEST, Datastore, DatastoreError, read_manifest
from freespec.proposers.retrieval.proposer import RetrievalOptions

DOCS = [[(7 * i + j) % 50 + 1 for j in range(300)] for i in range(40)]

CHILD = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from freespec.proposers.base import EngineInfo, Row
    from freespec.proposers.retrieval.proposer import RetrievalOptions, RetrievalProposer

    store, in_memory_mb = sys.argv[1], int(sys.argv[2])
    p = RetrievalProposer(RetrievalOptions(datastore=store, in_memory_mb=in_memory_mb, fuse_copy=False), 4)
    p.bind(EngineInfo(vocab_size=200_000, tokenizer_fingerprint=lambda: "sha256:test"))
    row = Row(0, np.asarray([(7 * 3 + j) % 50 + 1 for j in range(20)], dtype=np.int64), 1)
    before = p.propose([row])[0]
    assert before, "the datastore should draft before the file changes"
    for name in os.listdir(store):
        if name.endswith((".tokens", ".sa")):
            os.truncate(os.path.join(store, name), 0)  # rewritten in place: cp, rsync --inplace
    after = [p.propose([row])[0] for _ in range(3)]
    print("drafts", before, after, flush=True)
    """
)


def run_child(store: str, in_memory_mb: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD, store, str(in_memory_mb)], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("in_memory_mb", [1024, 0], ids=["in-memory", "mapped"])
def test_truncating_a_served_shard_does_not_kill_the_process(tmp_path, in_memory_mb):
    store = write_store(tmp_path / "ds", DOCS, shards=2)
    done = run_child(store, in_memory_mb)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # was -7 (SIGBUS) with a mapped file
    assert "drafts" in done.stdout
    if in_memory_mb:  # the private copy keeps drafting the text it read at start
        assert "[[], [], []]" not in done.stdout, done.stdout
    else:  # the mapped shards are dropped before they are touched
        assert "[[], [], []]" in done.stdout, done.stdout
        assert "changed in place" in done.stderr


def test_small_datastore_is_read_into_memory_and_large_one_mapped(tmp_path):
    store = write_store(tmp_path / "ds", DOCS)
    size = os.path.getsize(os.path.join(store, "shard-00000.tokens")) * 2
    private = Datastore.open(store, FP, in_memory_bytes=size)
    assert private.in_memory and not private.mapped_shards()
    mapped = Datastore.open(store, FP, in_memory_bytes=size - 1)
    assert not mapped.in_memory and mapped.mapped_shards() == ["shard-00000"]
    assert (private.shards[0].tokens == mapped.shards[0].tokens).all()
    assert mapped.check_files() == []  # unchanged files: nothing dropped
    os.truncate(os.path.join(store, "shard-00000.sa"), 8)
    assert mapped.check_files() == ["shard-00000"]
    assert len(mapped.shards[0].sa) == 0 and len(mapped.shards[0].tokens) == 0
    assert mapped.check_files() == []  # dropped once


def test_replacing_a_file_by_rename_keeps_the_mapped_copy_working(tmp_path):
    store = write_store(tmp_path / "ds", DOCS)
    mapped = Datastore.open(store, FP, in_memory_bytes=0)
    path = os.path.join(store, "shard-00000.tokens")
    first = mapped.shards[0].tokens.copy()
    with open(path + ".new", "wb") as f:
        f.write(b"\0" * 8)
    os.replace(path + ".new", path)  # what `datastore build --force` does: the old inode stays whole
    assert mapped.check_files() == []
    assert (mapped.shards[0].tokens == first).all()


def write_manifest(store: str, **changes) -> None:
    path = os.path.join(store, MANIFEST)
    manifest = json.loads(open(path).read())
    manifest.update(changes)
    open(path, "w").write(json.dumps(manifest))


@pytest.mark.parametrize("name", ["/etc/passwd", "../outside", "a/../../b", "sub/shard", "..", "", "x\0y"])
def test_shard_names_outside_the_directory_are_refused(tmp_path, name):
    store = write_store(tmp_path / "ds", DOCS)
    manifest = json.loads(open(os.path.join(store, MANIFEST)).read())
    manifest["shards"][0]["name"] = name
    write_manifest(store, shards=manifest["shards"])
    with pytest.raises(DatastoreError, match=r"field 'shards\[0\]\.name'"):
        read_manifest(store)
    with pytest.raises(DatastoreError, match=r"field 'shards\[0\]\.name'"):
        Datastore.open(store)
    with pytest.raises(ValueError, match=r"shards\[0\]\.name"):  # at config time, before any worker starts
        RetrievalOptions(datastore=store)


@pytest.mark.parametrize("tokenizer", ["fake-chars", 7, ["a"], {"name": "x", "fingerprint": 3}])
def test_a_tokenizer_field_of_the_wrong_type_is_named(tmp_path, tokenizer):
    store = write_store(tmp_path / "ds", DOCS)
    write_manifest(store, tokenizer=tokenizer)
    with pytest.raises(DatastoreError, match="field 'tokenizer(.fingerprint)?'"):
        read_manifest(store)
    with pytest.raises(DatastoreError, match="field 'tokenizer(.fingerprint)?'"):
        Datastore.open(store, FP)


@pytest.mark.parametrize("field,value", [("shards", {"a": 1}), ("shards", [3]), ("shards", [{"name": "a", "tokens": -1}]),
                                         ("shards", [{"name": "a", "tokens": True}])])
def test_malformed_shard_lists_are_named(tmp_path, field, value):
    store = write_store(tmp_path / "ds", DOCS)
    write_manifest(store, **{field: value})
    with pytest.raises(DatastoreError, match="field 'shards"):
        read_manifest(store)


def test_duplicate_shard_names_are_refused(tmp_path):
    store = write_store(tmp_path / "ds", DOCS)
    manifest = json.loads(open(os.path.join(store, MANIFEST)).read())
    write_manifest(store, shards=manifest["shards"] * 2)
    with pytest.raises(DatastoreError, match=r"field 'shards\[1\]\.name'.*twice"):
        read_manifest(store)


# --------------------------------------------------------------------------- builds killed by SIGKILL (issue 67)

BUILDER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from freespec.proposers.retrieval import build

    corpus, out, point, ready = sys.argv[1:5]
    target = Path(out).absolute()

    def pause():
        Path(ready).write_text(str(os.getpid()))
        time.sleep(600)

    if point == "tokenizing":  # the first shard file is on disk in the work folder
        real_write = build._write_array
        def write_array(path, chunks):
            done = real_write(path, chunks)
            pause()
        build._write_array = write_array
    elif point == "swap":  # just before anything is moved to the datastore's path
        real_rename = os.rename
        def rename(src, dst, *args, **kwargs):
            if Path(dst).absolute() == target:
                pause()
            return real_rename(src, dst, *args, **kwargs)
        os.rename = rename
        if hasattr(build, "_exchange"):
            build._exchange = lambda a, b: pause()
    elif point == "after-swap":  # the new datastore in place, the old one not yet removed
        real_exchange = build._exchange
        def exchange(a, b):
            done = real_exchange(a, b)
            pause()
        build._exchange = exchange
    build.build_datastore([corpus], out, lambda texts: [[ord(c) % 1000 for c in t] for t in texts],
                          tokenizer_name="chars", fingerprint="sha256:chars", vocab_size=1000, progress=False,
                          force=True)
    """
)


def _corpus(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text("".join(json.dumps({"text": f"{text} {i}"}) + "\n" for i in range(200)))
    return path


def _build(corpus, out, **kwargs):
    from freespec.proposers.retrieval.build import build_datastore

    return build_datastore([str(corpus)], out, lambda texts: [[ord(c) % 1000 for c in t] for t in texts],
                           tokenizer_name="chars", fingerprint="sha256:chars", vocab_size=1000, progress=False,
                           **kwargs)


def _start_paused(tmp_path, corpus, out, point) -> subprocess.Popen:
    import time

    ready = tmp_path / f"ready-{point}-{time.monotonic_ns()}"
    child = subprocess.Popen([sys.executable, "-c", BUILDER, str(corpus), str(out), point, str(ready)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if child.poll() is not None:
            pytest.fail(f"the build did not reach {point!r}: exit {child.returncode}\n{child.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            child.kill()
            pytest.fail(f"the build did not reach {point!r} in 60 s")
        time.sleep(0.05)
    return child


def _sigkill(child: subprocess.Popen) -> None:
    import signal

    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL


def _debris(tmp_path, name="ds"):
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(f".{name}."))


def test_a_build_killed_by_sigkill_leaves_work_that_the_next_build_removes(tmp_path):
    corpus, out = _corpus(tmp_path, "a.jsonl", "first corpus"), tmp_path / "ds"
    _sigkill(_start_paused(tmp_path, corpus, out, "tokenizing"))
    assert _debris(tmp_path) and not out.exists()  # the killed build's work folder, a shard in it
    _build(corpus, out)
    assert _debris(tmp_path) == []
    assert Datastore.open(out).total_tokens > 0


def test_the_next_build_keeps_the_work_folder_of_a_live_build(tmp_path):
    corpus, out = _corpus(tmp_path, "a.jsonl", "first corpus"), tmp_path / "ds"
    live = _start_paused(tmp_path, corpus, out, "tokenizing")
    try:
        theirs = _debris(tmp_path)
        assert len(theirs) == 1
        _build(corpus, out)  # the same datastore, built meanwhile by this process
        assert _debris(tmp_path) == theirs
    finally:
        _sigkill(live)
    _build(corpus, out, force=True)
    assert _debris(tmp_path) == []


@pytest.mark.parametrize("point", ["swap", "after-swap"])
def test_a_forced_rebuild_killed_at_the_swap_leaves_a_datastore_at_the_path(tmp_path, point):
    out = tmp_path / "ds"
    old = _build(_corpus(tmp_path, "old.jsonl", "the old corpus"), out)
    new_corpus = _corpus(tmp_path, "new.jsonl", "a new and longer corpus")
    _sigkill(_start_paused(tmp_path, new_corpus, out, point))
    # Readers (a server starting now) find a whole datastore at the path: the old one, or the new one.
    store = Datastore.open(out)
    expected = old["total_tokens"] if point == "swap" else _build(new_corpus, tmp_path / "check")["total_tokens"]
    assert store.total_tokens == expected
    store.close()
    rebuilt = _build(new_corpus, out, force=True)  # and the next build removes what the killed one left
    assert _debris(tmp_path) == [] and read_manifest(out)["total_tokens"] == rebuilt["total_tokens"]


def test_readers_find_a_whole_datastore_while_it_is_rebuilt_again_and_again(tmp_path):
    import threading

    out = tmp_path / "ds"
    corpora = [_corpus(tmp_path, f"{i}.jsonl", "text " * (i + 1)) for i in range(2)]
    _build(corpora[0], out)
    failures, done = [], threading.Event()

    def read():
        while not done.is_set():
            try:
                Datastore.open(out).close()
            except Exception as e:  # noqa: BLE001 - any failure is the finding
                failures.append(repr(e))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(12):
            _build(corpora[i % 2], out, force=True)
    finally:
        done.set()
        reader.join()
    assert failures == []
