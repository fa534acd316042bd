"""Issue 66: the responses' bound across all ``cache_salt`` scopes (``max_saved_responses``) may evict a scope's
every response from a writer's memory. With snapshots, such a store's file could say only what it evicted, which
readers refused; with the folder log (issue 87) what was appended stays appended: every reader (a peer, the
writer's restart) reads every record back, refuses none, and keeps the newest within the same bound; a scope used
again is appended to again. Real files in ``tmp_path``; no engine."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from freespec import confined
from freespec.proposers.learned.folder_log import FolderLog
from freespec.proposers.learned.response_store import ResponseStore, read_store

FP = "sha256:tok-a"
ME, PEER = "host-a.1.1", "host-b.1.1"
MAX_RESPONSES = 4  # across all scopes: small enough that the oldest scope is evicted whole


@pytest.fixture(autouse=True)
def _release(tmp_path):
    yield
    confined.release(str(tmp_path))


def scope(i: int) -> str:
    return f"{i:032x}"  # a scope is a 128-bit hash, 32 hex digits


def writer(root: Path, who: str = ME) -> FolderLog:
    return FolderLog(str(root), fingerprint=FP, vocab_size=1000, max_responses=MAX_RESPONSES, max_tokens=1_000_000,
                     max_age_s=30 * 86_400.0, max_bytes=10**12, interval_s=0, writer=who)


def response(i: int) -> np.ndarray:
    return (np.arange(20) + i) % 1000


def read(path: Path):
    return read_store(str(path), fingerprint=FP, vocab_size=1000, max_responses=MAX_RESPONSES,
                      max_tokens=1_000_000)


def fill_then_evict_the_first_scope(root: Path) -> FolderLog:
    """Scope 0 gets two responses, appended; then scope 1's four evict both from memory (scope 0 is the least
    recently used)."""
    sr = writer(root)
    sr.add(scope(0), response(0))
    sr.add(scope(0), response(1))
    sr.sync()
    for i in range(2, 6):
        sr.add(scope(1), response(i))
    assert sr.held.of(scope(0)) == [] and len(sr.held.of(scope(1))) == MAX_RESPONSES
    return sr


def loaded(log: FolderLog) -> dict[str, list[list[int]]]:
    out: dict[str, list[list[int]]] = {}
    for s, tokens in log.loaded:
        out.setdefault(s, []).append(tokens.tolist())
    return out


def test_a_scope_evicted_whole_leaves_segments_every_reader_reads_back_within_the_bound(tmp_path, caplog):
    sr = fill_then_evict_the_first_scope(tmp_path)
    sr.sync()
    assert sr.appended == 6  # each appended once
    with caplog.at_level(logging.WARNING, logger="freespec"):
        peer = writer(tmp_path, who=PEER)  # a peer's start, as the suffix source's
        peer.sync()
    assert not caplog.records and peer.refused == 0
    assert loaded(peer) == {scope(1): [response(i).tolist() for i in range(2, 6)]}  # the newest, within the bound
    peer.close()
    sr.close()


def test_the_last_append_at_exit_leaves_what_a_restart_reads_back(tmp_path, caplog):
    """At exit ``close`` appends what waits; the writer's next incarnation reads it all back, without a warning."""
    sr = fill_then_evict_the_first_scope(tmp_path)
    sr.close()
    with caplog.at_level(logging.WARNING, logger="freespec"):
        again = writer(tmp_path)
    assert not caplog.records and again.refused == 0
    assert {s: len(r) for s, r in loaded(again).items()} == {scope(1): MAX_RESPONSES}
    again.close()


def test_an_evicted_scope_used_again_is_appended_again(tmp_path):
    sr = fill_then_evict_the_first_scope(tmp_path)
    sr.sync()
    peer = writer(tmp_path, who=PEER)
    peer.take()
    sr.add(scope(0), response(9))
    sr.sync()
    peer.sync()
    assert [(s, t.tolist()) for s, t in peer.take().new] == [(scope(0), response(9).tolist())]
    peer.close()
    sr.close()


def test_a_store_that_holds_nothing_is_written_as_one_read_store_accepts(tmp_path):
    """A store may evict its last response (``evict_oldest``): its file then holds no responses and, without
    any, no horizon either (a file's horizon with no responses is refused as corrupt, so it must not be
    written)."""
    store = ResponseStore(str(tmp_path / "r.bin"), fingerprint=FP, vocab_size=1000, max_responses=MAX_RESPONSES)
    store.add(response(0))
    store.evict_oldest()
    store.save()
    stored = read(tmp_path / "r.bin")
    assert stored.entries == [] and stored.horizon == (0, b"")
