"""Issue 66: the responses' bound across all ``cache_salt`` scopes (``max_saved_responses``) may evict a scope's
every response. Its store then holds nothing but what it evicted (its horizon), which no file may say:
``read_store`` refuses a file with a horizon and no responses, so peers would skip it and the writer itself
would not reload it. Real files in ``tmp_path``; no engine."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from freespec.proposers.learned import state_dir
from freespec.proposers.learned.response_store import ResponseStore, read_store
from freespec.proposers.learned.scoped_responses import ScopedResponses
from scoped_helpers import save

FP = "sha256:tok-a"
ME, PEER = "host-a.1.1", "host-b.1.1"
MAX_RESPONSES = 4  # across all scopes: small enough that the oldest scope is evicted whole


def scope(i: int) -> str:
    return f"{i:032x}"  # a scope is a 128-bit hash, 32 hex digits


def writer(root: Path, monkeypatch, who: str = ME) -> ScopedResponses:
    monkeypatch.setattr(state_dir, "writer_id", lambda: who)
    return ScopedResponses(str(root), fingerprint=FP, vocab_size=1000, max_responses=MAX_RESPONSES,
                           max_tokens=1_000_000, max_age_s=30 * 86_400.0, max_bytes=10**12)


def response(i: int) -> np.ndarray:
    return (np.arange(20) + i) % 1000


def read(path: Path):
    return read_store(str(path), fingerprint=FP, vocab_size=1000, max_responses=MAX_RESPONSES,
                      max_tokens=1_000_000)


def fill_then_evict_the_first_scope(root: Path, monkeypatch) -> ScopedResponses:
    """Scope 0 gets two responses and is saved; then scope 1's four evict both (scope 0 is the least recently
    used), and the next save finds scope 0's store empty, with the key of what it evicted."""
    sr = writer(root, monkeypatch)
    sr.add(scope(0), response(0))
    sr.add(scope(0), response(1))
    save(sr)
    assert len(read(root / scope(0) / f"{ME}.bin").entries) == 2
    for i in range(2, 6):
        sr.add(scope(1), response(i))
    assert len(sr.stores[scope(0)]) == 0 and sr.stores[scope(0)]._snapshot().horizon != (0, b"")
    return sr


def check_every_file_reads_back(root: Path) -> None:
    files = sorted(root.glob("*/*.bin"))
    assert files
    for path in files:
        assert read(path).entries, path  # no file of a store that holds nothing


def test_a_scope_evicted_whole_leaves_no_file_a_peer_or_a_restart_refuses(tmp_path, monkeypatch, caplog):
    root = tmp_path / "suffix"
    sr = fill_then_evict_the_first_scope(root, monkeypatch)
    save(sr)
    check_every_file_reads_back(root)
    assert not (root / scope(0) / f"{ME}.bin").exists()  # its file said what the store no longer holds
    assert len(read(root / scope(1) / f"{ME}.bin").entries) == MAX_RESPONSES

    # a peer merges every scope's files as the suffix source does, at its start and while serving
    with caplog.at_level(logging.WARNING, logger="freespec"):
        peer = writer(root, monkeypatch, who=PEER)
        loaded = peer.load()
        save(peer)
    assert not [r for r in caplog.records if "skipped" in r.getMessage()]
    assert [len(r) for r in loaded.values()] == [MAX_RESPONSES]
    peer.close()
    sr.close()
    check_every_file_reads_back(root)


def test_the_final_save_of_an_evicted_scope_leaves_no_file_either(tmp_path, monkeypatch, caplog):
    """At exit ``close`` writes every store that has a file: the emptied one's is removed instead."""
    root = tmp_path / "suffix"
    sr = fill_then_evict_the_first_scope(root, monkeypatch)
    sr.close()
    check_every_file_reads_back(root)
    assert not (root / scope(0) / f"{ME}.bin").exists()

    # the writer's next incarnation loads all it wrote, without a warning
    with caplog.at_level(logging.WARNING, logger="freespec"):
        again = writer(root, monkeypatch)
        loaded = again.load()
    assert not [r for r in caplog.records if "skipped" in r.getMessage()]
    assert {s: len(r) for s, r in loaded.items()} == {scope(1): MAX_RESPONSES}
    again.close()


def test_an_evicted_scope_used_again_is_saved_again(tmp_path, monkeypatch):
    root = tmp_path / "suffix"
    sr = fill_then_evict_the_first_scope(root, monkeypatch)
    save(sr)
    sr.add(scope(0), response(9))
    save(sr)
    assert [e.tokens.tolist() for e in read(root / scope(0) / f"{ME}.bin").entries] == [response(9).tolist()]
    check_every_file_reads_back(root)
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
