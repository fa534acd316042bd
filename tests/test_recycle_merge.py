"""Recycle matrices across replicas: stamps, the newest-row-wins merge, merge_from, `freespec recycle`."""
import json
import logging
import time

import numpy as np
import pytest

from freespec.cli.main import main
from freespec.proposers.base import EngineInfo, Row, ScoredPositions
from freespec.proposers.recycle.proposer import RecycleOptions, RecycleProposer
from freespec.proposers.recycle.matrix import (
    Matrix, MatrixFileError, merge_files, merge_into, read_matrix, write_matrix,
)

VOCAB, C = 50, 4
FP = "sha256:test-vocab"


def matrix(rows: dict, tokenizer=FP, vocab=VOCAB, c=C) -> Matrix:
    """rows: {token: (stamp, [candidates])}."""
    m = Matrix.empty(vocab, c, tokenizer, "m")
    for token, (stamp, cands) in rows.items():
        m.ids[token, : len(cands)] = cands
        m.probs[token, : len(cands)] = 0.9
        m.stamps[token] = stamp
    return m


def file_of(tmp_path, name, rows, **kw) -> str:
    path = str(tmp_path / name)
    write_matrix(path, matrix(rows, **kw))
    return path


def test_newest_row_wins_and_an_empty_row_never_does():
    dst = matrix({1: (10, [2]), 2: (30, [3]), 3: (20, [4])})
    src = matrix({1: (20, [7]), 2: (10, [8]), 4: (5, [9])})
    src.stamps[3] = 99  # a stamp on an empty row (ids -1) must not erase a known one
    assert merge_into(dst, src) == 2
    assert dst.ids[1, 0] == 7 and dst.stamps[1] == 20  # newer in src
    assert dst.ids[2, 0] == 3  # newer in dst
    assert dst.ids[3, 0] == 4  # src's row is empty
    assert dst.ids[4, 0] == 9  # only src knew it


def test_merge_is_idempotent_order_free_and_ties_keep_the_row_merged_into():
    a = {1: (10, [2]), 2: (30, [3])}
    b = {1: (20, [7]), 2: (10, [8]), 5: (1, [6])}
    ab, ba = matrix(a), matrix(b)
    merge_into(ab, matrix(b))
    merge_into(ba, matrix(a))
    assert np.array_equal(ab.ids, ba.ids) and np.array_equal(ab.stamps, ba.stamps)
    assert merge_into(ab, matrix(a)) == 0 and merge_into(ab, matrix(b)) == 0  # merging again changes nothing
    tie = matrix({1: (10, [2])})
    merge_into(tie, matrix({1: (10, [9])}))
    assert tie.ids[1, 0] == 2


def test_merge_files_writes_a_checked_file(tmp_path):
    a = file_of(tmp_path, "a.npz", {1: (10, [2]), 2: (30, [3])})
    b = file_of(tmp_path, "b.npz", {1: (20, [7]), 3: (5, [4])})
    out = str(tmp_path / "out.npz")
    result, taken = merge_files([a, b], out)
    assert taken == [2, 2]
    m = read_matrix(out)
    assert [m.ids[t, 0] for t in (1, 2, 3)] == [7, 3, 4]
    assert m.tokenizer == FP and np.array_equal(m.stamps, result.stamps)


@pytest.mark.parametrize(
    "kw, field",
    [({"tokenizer": "sha256:other"}, "field 'tokenizer'"), ({"vocab": 60}, "field 'vocab_size' is 60"),
     ({"c": 8}, "field 'candidates' is 8")],
)
def test_merge_refuses_another_vocabulary_naming_the_field(tmp_path, kw, field):
    a = file_of(tmp_path, "a.npz", {1: (10, [2])})
    b = file_of(tmp_path, "b.npz", {1: (20, [7])}, **kw)
    with pytest.raises(MatrixFileError, match=f"merge input '.*b.npz'.*{field}"):
        merge_files([a, b], str(tmp_path / "out.npz"))
    assert not (tmp_path / "out.npz").exists()


def test_version_1_files_are_read_with_known_rows_older_than_any_stamped_row(tmp_path):
    import hashlib

    ids = np.full((VOCAB, C), -1, np.int32)
    ids[1, 0] = 2
    probs = np.zeros((VOCAB, C), np.float16)
    meta = {"format": "freespec-recycle-matrix", "version": 1, "vocab_size": VOCAB, "candidates": C,
            "tokenizer": FP, "model": "m", "updates": 1,
            "sha256": hashlib.sha256(ids.tobytes() + probs.tobytes()).hexdigest()}
    path = tmp_path / "v1.npz"
    np.savez(path, ids=ids, probs=probs, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
    m = read_matrix(str(path))
    assert m.stamps[1] == 1 and m.stamps[2] == 0
    newer = matrix({1: (2, [9])})
    merge_into(m, newer)
    assert m.ids[1, 0] == 9


# ---------------------------------------------------------------- the proposer
def make(k=3, **opts):
    p = RecycleProposer(RecycleOptions(candidates=C, tree_widths=(2, 1), **opts), k)
    p.bind(EngineInfo(vocab_size=VOCAB, model="m", tokenizer_fingerprint=lambda: FP))
    return p


def learn(p, pairs):
    tokens = np.array(list(pairs), np.int32)
    ids = np.full((len(pairs), C), 49, np.int32)
    ids[:, 0] = list(pairs.values())
    probs = np.full((len(pairs), C), 0.01, np.float32)
    probs[:, 0] = 0.97
    p.observe(ScoredPositions(tokens, ids, probs))


def draft(p, token):
    return p.propose([Row(0, np.array([token], np.int32), 1)])[0]


def test_observe_stamps_the_rows_it_writes():
    p = make()
    learn(p, {1: 2})
    assert p.matrix.stamps[1] > 1_600_000_000 and p.matrix.stamps[2] == 0


def test_a_replica_drafts_what_another_learned_through_merge_from(tmp_path):
    a = make(matrix_path=str(tmp_path / "a.npz"))
    learn(a, {1: 2, 2: 3, 3: 4})
    a.save()
    b = make(merge_from=(str(tmp_path / "a.npz"),))
    assert draft(b, 1) == [2, 3, 4]
    assert draft(make(), 1) == []  # without the merge it knows nothing


def test_merge_from_is_picked_up_when_it_appears_or_changes_and_a_bad_one_is_skipped(tmp_path, caplog):
    peer = str(tmp_path / "fleet.npz")
    b = make(merge_from=(peer,), save_every_s=1e-6)  # does not exist yet: a cold start
    assert draft(b, 1) == []
    soon = int(time.time()) + 120  # newer than its own rows, within the clock bound (MAX_CLOCK_AHEAD_S)
    write_matrix(peer, matrix({1: (soon, [5]), 5: (soon, [6])}))
    draft(b, 1)  # the check is asked for after drafting, every save_every_s, and runs in the background
    assert b.wait_files()
    assert draft(b, 1) == [5, 6]
    with open(peer, "wb") as f:
        f.write(b"garbage")
    with caplog.at_level(logging.WARNING, logger="freespec"):
        draft(b, 1)
        assert b.wait_files()
        assert draft(b, 1) == [5, 6]  # the server keeps what it has
    assert "merge_from" in caplog.text and "skipped" in caplog.text


def test_a_bad_merge_from_at_start_stops_the_engine_naming_the_option(tmp_path):
    path = file_of(tmp_path, "other.npz", {1: (10, [2])}, tokenizer="sha256:other")
    with pytest.raises(MatrixFileError, match="recycle merge_from .*field 'tokenizer'"):
        make(merge_from=(path,))
    with pytest.raises(ValueError, match="merge_from '/no/such/dir/x.npz': directory"):
        RecycleOptions(merge_from=("/no/such/dir/x.npz",))


def test_own_file_and_peer_file_combine_at_start(tmp_path):
    own = file_of(tmp_path, "own.npz", {1: (10, [2]), 2: (30, [3])})
    peer = file_of(tmp_path, "peer.npz", {1: (20, [7]), 7: (1, [8])})
    p = make(matrix_path=own, merge_from=(peer,))
    assert [p.ids[t, 0] for t in (1, 2, 7)] == [7, 3, 8]


# ---------------------------------------------------------------- the command
def test_cli_merge_and_info(tmp_path, capsys):
    a = file_of(tmp_path, "a.npz", {1: (10, [2])})
    b = file_of(tmp_path, "b.npz", {3: (20, [4])})
    out = str(tmp_path / "fleet.npz")
    assert main(["recycle", "merge", a, b, "-o", out]) == 0
    assert capsys.readouterr().out.strip() == out
    assert main(["recycle", "info", out]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["known_tokens"] == 2 and info["tokenizer"] == FP and info["newest_row"] == 20


def test_cli_merge_refuses_a_foreign_input_naming_the_field(tmp_path, capsys):
    a = file_of(tmp_path, "a.npz", {1: (10, [2])})
    b = file_of(tmp_path, "b.npz", {1: (10, [2])}, vocab=60)
    assert main(["recycle", "merge", a, b, "-o", str(tmp_path / "o.npz")]) == 2
    assert "field 'vocab_size' is 60" in capsys.readouterr().err
    assert main(["recycle", "merge", a, str(tmp_path / "missing.npz"), "-o", str(tmp_path / "o.npz")]) == 2


def test_a_merge_from_list_naming_the_servers_own_file_does_not_reread_it(tmp_path, caplog):
    own = str(tmp_path / "r1.npz")
    p = make(matrix_path=own, merge_from=(own, str(tmp_path / "r2.npz")), save_every_s=1e-6)
    learn(p, {1: 2})
    with caplog.at_level(logging.INFO, logger="freespec"):
        draft(p, 1)
        assert p.wait_files()
        draft(p, 1)  # the first call saved r1.npz; the second must not merge it back in
        assert p.wait_files()
    assert "merged" not in caplog.text
