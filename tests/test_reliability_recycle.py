"""recycle's file work off the hot path, its failures never raised in propose, and its option bounds (issue 19)."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from pydantic import ValidationError
from test_recycle import FP, VOCAB, make, row, scored

from freespec.proposers.recycle import proposer as recycle_module
from freespec.proposers.recycle.proposer import MAX_TREE_NODES, RecycleOptions, RecycleProposer, tree_nodes
from freespec.proposers.recycle.matrix import Matrix, load_matrix, write_matrix


def test_tree_bound_refuses_the_huge_tree_naming_the_field_and_count():
    with pytest.raises(ValidationError, match=r"tree_widths \[32, 32, .*\] make a draft tree of 1134979744800 nodes; "
                                              f"the limit is {MAX_TREE_NODES}"):
        RecycleOptions(candidates=32, tree_widths=(32,) * 8)  # was accepted: ~1.1e12 nodes built in a Python loop
    assert tree_nodes((4, 2, 2, 1, 1, 1, 1, 1)) == 108 and tree_nodes((4, 2), depth=4) == 4 + 8 + 8 + 8
    assert str(MAX_TREE_NODES) in RecycleOptions.model_fields["tree_widths"].description
    RecycleOptions(candidates=8, tree_widths=(8, 8, 8))  # 584 nodes: allowed
    with pytest.raises(ValueError, match=r"'tree_widths' \[8, 8, 8, 4\] with num_speculative_tokens 64 .* nodes"):
        RecycleProposer(RecycleOptions(candidates=8, tree_widths=(8, 8, 8, 4)), 64)  # 2632 + 60 * 2048


def slow_write(monkeypatch, seconds: float) -> list:
    """Make every matrix write take ``seconds`` (a network filesystem's fsync) and record the writing thread."""
    writers = []

    def write(path, m):
        writers.append(threading.current_thread().name)
        time.sleep(seconds)
        write_matrix(path, m)

    monkeypatch.setattr(recycle_module, "write_matrix", write)
    return writers


def test_saving_never_blocks_propose_and_only_the_latest_copy_is_written(tmp_path, monkeypatch):
    path = str(tmp_path / "m.npz")
    writers = slow_write(monkeypatch, 0.5)
    p = make(matrix_path=path, save_every_s=1e-6)
    p.observe(scored({1: [(2, 0.97)]}))
    worst = 0.0
    for i in range(20):
        t0 = time.perf_counter()
        p.propose([row(0, 1)])
        worst = max(worst, time.perf_counter() - t0)
        if i == 10:
            p.observe(scored({2: [(3, 0.97)]}))
    assert worst < 0.25, worst  # was 0.5 s per save, inside propose
    assert p.wait_files(10)
    assert set(writers) == {"freespec-recycle-files"}
    assert len(writers) <= 3  # 20 requests coalesced: one running, one waiting, then the latest
    m = load_matrix(path, vocab_size=VOCAB, candidates=8, tokenizer=FP)
    assert m.ids[1, 0] == 2 and m.ids[2, 0] == 3  # the latest copy won


def test_a_merge_from_stat_error_never_raises_in_propose_and_is_logged_once(tmp_path, caplog):
    peers = tmp_path / "peers"
    peers.mkdir()
    peer = str(peers / "fleet.npz")
    p = make(merge_from=(peer,), save_every_s=1e-6)
    peers.rmdir()
    peers.write_text("a file where the directory was")  # os.stat(peer): NotADirectoryError
    with caplog.at_level(logging.WARNING, logger="freespec"):
        for _ in range(5):
            p.propose([row(0, 1)])  # raised NotADirectoryError here on every step
            assert p.wait_files(10)
    warnings = [r for r in caplog.records if "cannot be read now" in r.getMessage()]
    assert len(warnings) == 1 and "NotADirectoryError" in warnings[0].getMessage()
    # The problem goes away: the file is merged at a later check.
    peers.unlink()
    peers.mkdir()
    m = Matrix.empty(VOCAB, 8, FP, "peer")
    m.ids[1, 0], m.stamps[1] = 7, int(time.time()) + 120  # newer than its own rows, within the clock bound (300 s)
    write_matrix(peer, m)
    p.propose([row(0, 1)])
    assert p.wait_files(10)
    assert p.ids[1, 0] == 7


def test_the_final_save_happens_at_close_and_the_thread_stops(tmp_path):
    path = str(tmp_path / "m.npz")
    p = make(matrix_path=path, save_every_s=3600)
    p.observe(scored({4: [(5, 0.9)]}))
    p.close()
    assert load_matrix(path, vocab_size=VOCAB, candidates=8, tokenizer=FP).ids[4, 0] == 5
    assert not p._files._thread.is_alive()


CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    sys.path.insert(0, sys.argv[2])
    from test_recycle import make, scored
    previous = []
    if sys.argv[3] == "chain":
        signal.signal(signal.SIGTERM, lambda s, f: (previous.append(s), print("previous handler ran", flush=True),
                                                    sys.exit(3)))
    p = make(matrix_path=sys.argv[1], save_every_s=3600)
    p.observe(scored({4: [(5, 0.9)]}))
    print("ready", flush=True)
    time.sleep(60)
    """
)


@pytest.mark.parametrize("previous,code", [("chain", 3), ("default", -signal.SIGTERM)])
def test_sigterm_saves_the_matrix_and_chains_the_previous_handler(tmp_path, previous, code):
    path = str(tmp_path / "m.npz")
    tests = os.path.dirname(__file__)
    child = subprocess.Popen([sys.executable, "-c", CHILD, path, tests, previous], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGTERM)
        out = child.communicate(timeout=60)[0]
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == code, out
    assert ("previous handler ran" in out) == (previous == "chain")
    assert load_matrix(path, vocab_size=VOCAB, candidates=8, tokenizer=FP).ids[4, 0] == 5


def test_a_proposer_built_outside_the_main_thread_installs_no_handler(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=make, kwargs=dict(matrix_path=str(tmp_path / "m.npz")))
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGTERM) is before


def test_background_failures_do_not_kill_the_thread(tmp_path, monkeypatch):
    path = str(tmp_path / "m.npz")
    calls = []

    def broken(m):
        calls.append(1)
        raise RuntimeError("disk on fire")

    p = make(matrix_path=path, save_every_s=1e-6)
    monkeypatch.setattr(p, "_write", broken)
    p._files._write = broken
    for i in range(3):
        p.observe(scored({10 + i: [(2, 0.97)]}))  # a change each time: an unchanged matrix is not written again
        p.propose([row(0, 1)])
        assert p.wait_files(10)
    assert len(calls) == 3 and p._files.errors == 3 and p._files._thread.is_alive()
    assert np.all(p.ids[1] == -1)  # the proposer carried on


def test_an_unchanged_matrix_is_not_copied_or_written_again(tmp_path, monkeypatch):
    path = str(tmp_path / "m.npz")
    writers = slow_write(monkeypatch, 0.0)
    p = make(matrix_path=path, save_every_s=1e-6)
    p.observe(scored({1: [(2, 0.97)]}))
    p.propose([row(0, 1)])
    assert p.wait_files(10) and len(writers) == 1
    mtime = os.stat(path).st_mtime_ns
    for _ in range(5):  # an idle server's ticks: the file (and its mtime, the peers' cue to read it) as it was
        p.propose([row(0, 1)])
        assert p.wait_files(10)
    assert len(writers) == 1 and os.stat(path).st_mtime_ns == mtime
    p.observe(scored({2: [(3, 0.97)]}))
    p.propose([row(0, 1)])
    assert p.wait_files(10) and len(writers) == 2
    saved = load_matrix(path, vocab_size=VOCAB, candidates=8, tokenizer=FP)
    assert saved.ids[2, 0] == 3
    p._merge("echo.npz", saved)  # a peer's file that holds nothing newer: not a change
    p.propose([row(0, 1)])
    assert p.wait_files(10) and len(writers) == 2
    saved.stamps[5], saved.ids[5, 0] = saved.stamps.max() + 1, 7  # one newer row: a change
    p._merge("peer.npz", saved)
    p.propose([row(0, 1)])
    assert p.wait_files(10) and len(writers) == 3


def test_an_idle_engine_saves_what_the_last_steps_learned_when_its_save_is_due(tmp_path, monkeypatch):
    """An engine with no more requests takes no step, where the periodic save runs: idle() saves instead."""
    path = str(tmp_path / "m.npz")
    writers = slow_write(monkeypatch, 0.0)
    p = make(matrix_path=path, save_every_s=0.5)
    p.propose([row(0, 1)])
    p.observe(scored({4: [(5, 0.9)]}))  # the last step's learning, then no more steps
    p.idle()  # within save_every_s of the last tick: not yet
    assert p.wait_files(10) and writers == []
    time.sleep(0.55)
    p.idle()
    assert p.wait_files(10) and len(writers) == 1
    assert load_matrix(path, vocab_size=VOCAB, candidates=8, tokenizer=FP).ids[4, 0] == 5
    time.sleep(0.55)
    p.idle()  # still idle, nothing new: not written again
    assert p.wait_files(10) and len(writers) == 1


def test_a_save_that_keeps_failing_is_logged_once_though_each_names_another_temporary_file(
    tmp_path, monkeypatch, caplog
):
    """The fault-injection run's read-only matrix directory logged every failed save (every 2 s): each
    PermissionError names a new temporary file, so the message was never the same twice."""
    attempts = []

    def refuse(path, m):
        attempts.append(path)
        raise PermissionError(1, "Operation not permitted", str(tmp_path / f".recycle-{len(attempts)}.npz.tmp"))

    monkeypatch.setattr(recycle_module, "write_matrix", refuse)
    p = make(matrix_path=str(tmp_path / "m.npz"), save_every_s=1e-6)
    p.observe(scored({1: [(2, 0.97)]}))
    with caplog.at_level(logging.ERROR, logger="freespec"):
        for _ in range(5):
            p.propose([row(0, 1)])
            assert p.wait_files(10)
    assert len(attempts) >= 3
    failures = [r for r in caplog.records if "could not save the recycle matrix" in r.getMessage()]
    assert len(failures) == 1 and ".recycle-1.npz.tmp" in failures[0].getMessage()
