"""Option ``state_max_mb`` (issue 66): one writer's log segments of all ``cache_salt`` scopes in a state directory
stay within a byte bound, the least recently used scope's going first and never a peer's (peers' go by age only).
Real files in ``tmp_path``; no engine."""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import pytest
from freespec import confined
from freespec.proposers.learned import state_dir
from freespec.proposers.learned.folder_log import EXT, SUM_BYTES, _REC, FolderLog, segment_header
from scoped_helpers import plant

FP = "sha256:tok-a"
ME, PEER = "host-a.1.1", "host-b.1.1"
TOKENS = 100  # tokens of each response added below
RECORD = _REC.size + 4 * TOKENS + SUM_BYTES  # one such response in a segment
ONE_FILE = len(segment_header(FP, 1000, ME, "0" * 32)) + RECORD  # a scope's segment holding one


@pytest.fixture(autouse=True)
def _release(tmp_path):
    yield
    confined.release(str(tmp_path))


def scope(i: int) -> str:
    return f"{i:032x}"  # a scope is a 128-bit hash, 32 hex digits


def writer(root: Path, monkeypatch, max_bytes: int) -> FolderLog:
    """This writer's log in ``root``'s state directory (``root`` is its ``suffix/``)."""
    return FolderLog(str(root.parent), fingerprint=FP, vocab_size=1000, max_responses=10_000, max_tokens=1_000_000,
                     max_age_s=30 * 86_400.0, max_bytes=max_bytes, interval_s=0, writer=ME)


def save(sr: FolderLog) -> None:
    """One file round, as the log's thread runs every save interval."""
    sr.sync()


def response(i: int) -> np.ndarray:
    return (np.arange(TOKENS) + i) % 1000


def own_files(root: Path) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for p in root.glob(f"*/{ME}.*{EXT}"):
        sizes[p.parent.name] = sizes.get(p.parent.name, 0) + p.stat().st_size
    return sizes


def test_the_bound_holds_across_many_scopes_and_the_newest_stay(tmp_path, monkeypatch):
    root = tmp_path / "suffix"
    sr = writer(root, monkeypatch, max_bytes=5 * ONE_FILE)
    for i in range(40):
        sr.add(scope(i), response(i))
        if i % 3 == 2:
            save(sr)
            assert sum(own_files(root).values()) <= 5 * ONE_FILE
    save(sr)
    assert sorted(own_files(root)) == [scope(i) for i in range(35, 40)]
    sr.close()
    assert sorted(own_files(root)) == [scope(i) for i in range(35, 40)]


def test_without_the_bound_the_files_add_up_past_it(tmp_path, monkeypatch):
    """The same traffic with a bound no save reaches: every scope keeps its file (what the bound prevents)."""
    root = tmp_path / "suffix"
    sr = writer(root, monkeypatch, max_bytes=10**12)
    for i in range(40):
        sr.add(scope(i), response(i))
    save(sr)
    assert sum(own_files(root).values()) == 40 * ONE_FILE > 5 * ONE_FILE
    sr.close()


def test_the_final_save_at_exit_holds_the_bound_too(tmp_path, monkeypatch):
    root = tmp_path / "suffix"
    sr = writer(root, monkeypatch, max_bytes=3 * ONE_FILE)
    for i in range(10):
        sr.add(scope(i), response(i))
    sr.close()
    assert sorted(own_files(root)) == [scope(i) for i in range(7, 10)]


def test_the_least_recently_used_scope_goes_first(tmp_path, monkeypatch):
    root = tmp_path / "suffix"
    a, b, c, d = (scope(i) for i in range(4))
    sr = writer(root, monkeypatch, max_bytes=3 * ONE_FILE + 64)  # three segments, and room for one grown a little
    for i, s in enumerate((a, b, c)):
        sr.add(s, response(i))
    save(sr)
    assert sorted(own_files(root)) == [a, b, c]
    sr.add(a, np.array([7]))  # a used again: b is now the least recently used, though added after a
    sr.add(d, response(3))
    save(sr)
    assert sorted(own_files(root)) == [a, c, d] and b not in sr._own
    sr.add(b, response(4))  # b back, the newest: c is the least recently used now
    save(sr)
    assert sorted(own_files(root)) == [a, b, d]
    sr.close()
    assert sum(own_files(root).values()) <= 3 * ONE_FILE + 64


def test_a_dropped_scope_is_logged_once_at_info_naming_only_its_hash(tmp_path, monkeypatch, caplog):
    root = tmp_path / "suffix"
    x, y = scope(1), scope(2)
    sr = writer(root, monkeypatch, max_bytes=ONE_FILE)
    with caplog.at_level(logging.INFO, logger="freespec"):
        for i in range(6):  # x and y in turn: each save drops the other
            sr.add((x, y)[i % 2], response(i))
            save(sr)
            assert list(own_files(root)) == [(x, y)[i % 2]]
    said = [r for r in caplog.records if "state_max_mb" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO, logging.INFO]
    assert sum(x in r.getMessage() for r in said) == 1 and sum(y in r.getMessage() for r in said) == 1
    assert not any(str(tmp_path) in r.getMessage() or ME in r.getMessage() for r in said)  # no path, no writer
    sr.close()


def test_a_peers_file_is_never_removed_nor_counted(tmp_path, monkeypatch):
    root = tmp_path / "suffix"
    confined.confine(str(tmp_path))
    # a peer's segments in the scopes this writer will drop: more bytes than the whole bound
    peers = [plant(root / scope(i) / f"{PEER}.1{EXT}", [response(50 + j).tolist() for j in range(5)])
             for i in range(4)]
    sizes = [p.stat().st_size for p in peers]
    sr = writer(root, monkeypatch, max_bytes=3 * ONE_FILE)
    assert sum(sizes) > sr.max_bytes
    for i in range(6):
        sr.add(scope(i), response(i))
        save(sr)
        assert sum(own_files(root).values()) <= sr.max_bytes, own_files(root)
    sr.close()
    # this writer's segments of scopes 0-2 went, least recently used first; the newest stay, so the peer's
    # bytes were not counted against this writer's bound
    assert sorted(own_files(root)) == [scope(3), scope(4), scope(5)]
    assert [p.stat().st_size for p in peers] == sizes


def test_a_start_holds_the_bound_over_files_this_writer_left_with_a_larger_one(tmp_path, monkeypatch):
    root = tmp_path / "suffix"
    sr = writer(root, monkeypatch, max_bytes=10**9)
    for i in range(6):
        sr.add(scope(i), response(i))
    sr.close()
    assert len(own_files(root)) == 6
    again = writer(root, monkeypatch, max_bytes=2 * ONE_FILE)  # the same writer's name, restarted: its start
    assert sum(own_files(root).values()) <= 2 * ONE_FILE
    again.close()


@pytest.mark.parametrize("value", [True, False, -1, 0, "64", None])
def test_the_option_refuses_booleans_and_non_positive_values_naming_it(value):
    from freespec.vllm_plugins.frontend import FreespecConfigError, translate

    if value is None:  # not given: the default
        _, extra = translate({"plugin": "copy", "num_speculative_tokens": 4}, None)
        assert extra["freespec"]["state_max_mb"] == 256.0
        return
    with pytest.raises(FreespecConfigError, match="'state_max_mb'"):
        translate({"plugin": "copy", "num_speculative_tokens": 4, "state_max_mb": value}, None)


def test_the_option_reaches_the_suffix_source(tmp_path, monkeypatch):
    from freespec.proposers.api import EngineInfo
    from freespec.proposers.suffix_tree import SuffixOptions, SuffixTreeProposer, available
    from freespec.vllm_plugins.adapter_options import adapter_options

    if not available()[0]:
        pytest.skip("needs arctic-inference")
    options = adapter_options({"state_max_mb": 0.5})
    assert options.state_max_bytes == 500_000
    info = EngineInfo(vocab_size=1000, model="m", tokenizer_fingerprint=lambda: FP, state_dir=str(tmp_path),
                      state_max_age_s=options.state_max_age_s)
    monkeypatch.setattr(state_dir, "writer_id", lambda: ME)
    p = SuffixTreeProposer(SuffixOptions(), 4)
    p.bind(dataclasses.replace(info, state_max_bytes=options.state_max_bytes))
    assert p.learned.max_bytes == 500_000
    p.close()
