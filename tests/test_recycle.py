"""The recycle proposer: matrix updates, drafting through the tree, learning, warm start."""
import json
import os

import numpy as np
import pytest
from pydantic import ValidationError

from freespec.proposers.base import EngineInfo, Row, ScoredPositions
from freespec.proposers.recycle.proposer import RecycleOptions, RecycleProposer
from freespec.proposers.recycle.matrix import MatrixFileError, load_matrix, save_matrix

VOCAB = 100
FP = "sha256:test-vocab"


def make(k=4, **opts):
    p = RecycleProposer(RecycleOptions(**opts), k)
    p.bind(EngineInfo(vocab_size=VOCAB, model="m", tokenizer_fingerprint=lambda: FP))
    return p


def scored(pairs, c=8):
    """pairs: {token: [(candidate, prob), ...]} -> ScoredPositions."""
    tokens = np.array(list(pairs), dtype=np.int32)
    ids = np.full((len(pairs), c), 99, dtype=np.int32)
    probs = np.zeros((len(pairs), c), dtype=np.float32)
    for i, cands in enumerate(pairs.values()):
        for j, (t, q) in enumerate(cands):
            ids[i, j], probs[i, j] = t, q
    return ScoredPositions(tokens, ids, probs)


def row(key, *tokens, num_new=1):
    return Row(key, np.asarray(tokens, dtype=np.int32), num_new)


def test_matrix_update_keeps_latest_candidates_and_later_row_wins():
    p = make()
    p.observe(scored({5: [(6, 0.9)]}))
    p.observe(ScoredPositions(np.array([5, 5], np.int32), np.array([[7] * 8, [8] * 8], np.int32), np.full((2, 8), 0.5, np.float32)))
    assert p.ids[5, 0] == 8 and p.updates == 3
    assert p.ids[6, 0] == -1  # never scored


def test_drafts_the_confident_chain_and_nothing_when_unknown():
    p = make(k=4)
    p.observe(scored({1: [(2, 0.97)], 2: [(3, 0.97)], 3: [(4, 0.97)], 4: [(5, 0.97)]}))
    assert p.propose([row(0, 9, 1), row(1, 50)]) == [[2, 3, 4, 5], []]
    assert p.propose([row(0, 9, 1, 2, num_new=0)]) == [[]]  # partial prefill: no draft


def test_adaptive_takes_a_second_rank_with_a_sure_continuation_top1_does_not():
    pairs = {
        1: [(2, 0.45), (3, 0.40)],
        2: [(60, 0.03)],  # after the top candidate nothing is likely
        3: [(4, 0.97)],
        4: [(5, 0.97)],
        5: [(6, 0.97)],
    }
    adaptive, plain = make(k=4), make(k=4, adaptive=False)
    for p in (adaptive, plain):
        p.observe(scored(pairs))
    assert adaptive.propose([row(0, 1)]) == [[3, 4, 5, 6]]
    assert plain.propose([row(0, 1)]) == [[2, 60]]  # top-1 walk, which stops where nothing is known


def test_learns_from_what_vllm_accepts():
    p = make(k=3, min_token_gain=0.3)
    p.observe(scored({1: [(2, 0.4)], 2: [(3, 0.4)], 3: [(4, 0.4)]}))
    first = p.propose([row(0, 1)])[0]
    assert first == [2]  # 0.4 + 0.16 - 2 * 0.3 < 0.4 - 0.3: one token pays
    for _ in range(30):  # every draft fully accepted
        draft = p.propose([row(0, 1, num_new=len(first) + 1)])[0]
        first = draft
    assert len(draft) == 3
    for _ in range(200):  # now nothing is accepted
        draft = p.propose([row(0, 1, num_new=1)])[0]
    assert len(draft) <= 1


def test_release_and_state_bytes():
    p = make()
    base = p.state_bytes()
    assert base == VOCAB * 8 * (4 + 2) + VOCAB * 4  # ids + probs, and a stamp per token
    p.observe(scored({1: [(2, 0.97)]}))
    p.propose([row(7, 1)])
    assert p.state_bytes() > base
    p.release(7)
    assert p.state_bytes() == base


def test_options_are_checked():
    with pytest.raises(ValidationError, match="exceed candidates"):
        RecycleOptions(candidates=2, tree_widths=(4,))
    with pytest.raises(ValidationError, match="tree width"):
        RecycleOptions(tree_widths=(2, 0))
    with pytest.raises(ValidationError, match="does not exist"):
        RecycleOptions(matrix_path="/no/such/dir/m.npz")


def test_warm_start_round_trip(tmp_path):
    path = str(tmp_path / "m.npz")
    p = make(matrix_path=path)
    p.observe(scored({1: [(2, 0.97)], 2: [(3, 0.97)]}))
    p.save()
    q = make(matrix_path=path)
    assert np.array_equal(q.ids, p.ids) and q.updates == p.updates
    assert q.propose([row(0, 1)])[0][:2] == [2, 3]
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]  # the temporary file was renamed


def saved(tmp_path, **kw):
    path = str(tmp_path / "m.npz")
    ids = np.full((VOCAB, 8), -1, np.int32)
    save_matrix(path, ids, np.zeros((VOCAB, 8), np.float16), tokenizer=kw.pop("tokenizer", FP), **kw)
    return path


def test_refuses_a_matrix_from_another_tokenizer_or_size(tmp_path):
    path = saved(tmp_path, tokenizer="sha256:other", model="other-model")
    with pytest.raises(MatrixFileError, match="another tokenizer: field 'tokenizer'.*other-model"):
        make(matrix_path=path)
    path = saved(tmp_path)
    with pytest.raises(MatrixFileError, match="field 'vocab_size' is 100.*has 200"):
        load_matrix(path, vocab_size=200, candidates=8, tokenizer=FP)
    with pytest.raises(MatrixFileError, match="field 'candidates' is 8.*`candidates` is 4"):
        load_matrix(path, vocab_size=VOCAB, candidates=4, tokenizer=FP)


def test_refuses_corrupt_truncated_foreign_and_pickled_files(tmp_path):
    path = saved(tmp_path)
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    with pytest.raises(MatrixFileError, match="corrupt"):
        make(matrix_path=path)

    other = tmp_path / "foreign.npz"
    np.savez(other, weights=np.zeros(3))
    with pytest.raises(MatrixFileError, match="not a freespec-recycle-matrix"):
        load_matrix(str(other), vocab_size=VOCAB, candidates=8, tokenizer=FP)

    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, ids=np.array([object()], dtype=object), probs=np.zeros(1), meta=np.zeros(1, np.uint8))
    with pytest.raises(MatrixFileError):
        load_matrix(str(pickled), vocab_size=VOCAB, candidates=8, tokenizer=FP)

    # Same shapes, modified content: the checksum catches it.
    path = saved(tmp_path)
    with np.load(path) as z:
        ids, probs, stamps, meta = z["ids"].copy(), z["probs"], z["stamps"], z["meta"]
    ids[3, 0] = 7
    np.savez(path, ids=ids, probs=probs, stamps=stamps, meta=meta)
    with pytest.raises(MatrixFileError, match="checksum"):
        make(matrix_path=path)

    meta2 = json.loads(meta.tobytes())
    meta2["version"] = 99
    np.savez(path, ids=ids, probs=probs, stamps=stamps, meta=np.frombuffer(json.dumps(meta2).encode(), np.uint8))
    with pytest.raises(MatrixFileError, match="format version 99"):
        make(matrix_path=path)
