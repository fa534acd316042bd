"""The hybrid proposer: several sources, one fused chain per request."""
import numpy as np
import pytest
from pydantic import ValidationError

from freespec.proposers.base import EngineInfo, Row, ScoredPositions
from freespec.proposers.hybrid import HybridOptions, HybridProposer


def make(**opts):
    p = HybridProposer(HybridOptions(**opts), 4)
    p.bind(EngineInfo(vocab_size=100))
    return p


def row(key, tokens, num_new=1):
    return Row(key, np.asarray(tokens, dtype=np.int32), num_new)


def test_options_are_checked():
    with pytest.raises(ValidationError, match="distinct names"):
        HybridOptions(sources=("copy", "magic"))
    with pytest.raises(ValidationError, match="needs the \"datastore\" option"):
        HybridOptions(sources=("copy", "retrieval"))
    with pytest.raises(ValidationError, match="not among the sources"):
        HybridOptions(datastore="/tmp")


def test_needs_the_target_topk_only_with_recycle():
    assert make(sources=("copy",)).target_topk == 0
    assert make().target_topk == 8


def test_each_request_gets_the_source_that_knows_something():
    p = make()
    # recycle has learned 40 -> 41 -> 42 -> 43 -> 44 with confidence
    p.observe(
        ScoredPositions(
            np.array([40, 41, 42, 43], np.int32),
            np.array([[41] + [0] * 7, [42] + [0] * 7, [43] + [0] * 7, [44] + [0] * 7], np.int32),
            np.full((4, 8), 0.0, np.float32) + np.array([[0.97] + [0.0] * 7], np.float32),
        )
    )
    copying = [5, 6, 7, 8, 9, 10, 11, 5, 6, 7]  # repeats itself: copy knows 8, 9, 10, 11
    drafts = p.propose([row(0, copying), row(1, [1, 2, 40])])
    assert drafts[0][:2] == [8, 9]
    assert drafts[1][:2] == [41, 42]
    p.release(0)
    p.release(1)
    assert p._supported == {}


def test_a_high_bar_cuts_drafts():
    p = make(sources=("copy",))
    copying = [5, 6, 7, 8, 9, 10, 11, 5, 6, 7]
    p.token_cost = 0.99
    assert p.propose([row(0, copying)]) == [[]]


def test_a_source_that_cannot_pay_on_its_own_is_not_asked(monkeypatch):
    p = make()
    calls = []
    for name, source in p.sources.items():
        monkeypatch.setattr(source, "candidates", lambda rows, name=name: calls.append(name) or [None] * len(rows))
    for _ in range(30):  # recycle's drafts keep failing, copy's are accepted
        p.weights.observe({"recycle": 2}, 0)
        p.weights.observe({"copy": 2}, 2)
    p.token_cost = 0.5
    p.propose([row(0, [1, 2, 3])])
    assert calls == ["copy"]
    assert not p.wants_target_topk()  # recycle is not asked, so nothing needs the target's top-k
    calls.clear()
    p.token_cost = None  # fixed bars: every source is asked
    p.propose([row(0, [1, 2, 3])])
    assert calls == ["copy", "recycle"]
    assert p.wants_target_topk()


def test_retrieval_source_offers_every_continuation_and_fuses_like_the_retrieval_plugin(tmp_path):
    from freespec.proposers.retrieval import RetrievalOptions, RetrievalProposer
    from tests.test_retrieval import FP, write_store

    # "10 11 12" went on with 13 14 15 three times and with 99 98 twice: one chain could not say how sure.
    store = write_store(tmp_path / "store", [[10, 11, 12, 13, 14, 15]] * 3 + [[10, 11, 12, 99, 98]] * 2)
    info = EngineInfo(vocab_size=200_000, tokenizer_fingerprint=lambda: FP)
    hybrid = HybridProposer(HybridOptions(sources=("copy", "retrieval"), datastore=store), 4)
    fused = RetrievalProposer(RetrievalOptions(datastore=store, fuse_copy=True), 4)
    for p in (hybrid, fused):
        p.bind(info)
    offered = hybrid.sources["retrieval"].candidates([row(0, [7, 10, 11, 12]), row(1, [7, 8])])
    assert sorted(offered[0].chains[:, 0].tolist()) == [13, 13, 13, 99, 99] and offered[1] is None
    # With the same sources the two plugins draft the same, step after step.
    context = [7, 10, 11, 12]
    for want in ([13, 14, 15], [14, 15]):
        a, b = hybrid.propose([row(0, context)]), fused.propose([row(0, context)])
        assert a == b == [want]
        context = context + want[:1]
