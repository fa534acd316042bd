"""hybrid's ``draft`` source: a draft model (run as ``pearl`` runs it) fused with the other sources (RASD)."""
import numpy as np
import pytest
from pydantic import ValidationError

pytest.importorskip("torch")
pytest.importorskip("transformers")

from freespec.proposers.base import EngineInfo, Row, StepContext  # noqa: E402
from freespec.proposers.hybrid import HybridOptions, HybridProposer  # noqa: E402
from pearl_helpers import VOCAB, arr  # noqa: E402

EXACT = {"placement": "thread", "min_confidence": 0.0, "adaptive_length": False}  # k tokens a step


def make(tiny_dir, k=4, **opts):
    p = HybridProposer(HybridOptions(**{"draft_model": tiny_dir, "draft": EXACT, "min_support": 0.0, **opts}), k)
    p.bind(EngineInfo(vocab_size=VOCAB))
    return p


def test_a_draft_model_given_adds_the_draft_source_to_the_defaults(tiny_dir):
    assert HybridOptions(draft_model=tiny_dir).chosen_sources()[-1] == "draft"
    assert "draft" not in HybridOptions().chosen_sources()
    assert HybridOptions(sources=("copy", "draft"), draft_model=tiny_dir).chosen_sources() == ("copy", "draft")


@pytest.mark.parametrize("opts, message", [
    ({"sources": ("copy", "draft")}, 'the "draft" source needs the "draft_model" option'),
    ({"sources": ("copy",), "draft_model": "TINY"}, '"draft_model" is given but "draft" is not among the sources'),
    ({"draft_model": "TINY", "draft": {"draft_model": "TINY"}}, "hybrid's \"draft_model\" option"),
    ({"draft_model": "TINY", "draft": {"min_confidence": 2}}, "draft.min_confidence"),
    ({"draft_model": "/nonexistent/draft"}, "draft_model"),
])
def test_bad_draft_options_are_refused_naming_the_field(tiny_dir, opts, message):
    opts = {k: (tiny_dir if v == "TINY" else {kk: (tiny_dir if vv == "TINY" else vv) for kk, vv in v.items()}
                if isinstance(v, dict) else v) for k, v in opts.items()}
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        HybridOptions(**opts)


def test_the_draft_chain_is_drafted_where_no_other_source_knows_anything(tiny_dir, reference):
    k = 4
    p = make(tiny_dir, k, sources=("copy", "draft"))
    try:
        context = [5, 17, 33, 2, 60]  # repeats nothing: copy has no match
        drafts = p.draft([Row(0, arr(context), 1)], StepContext())
        assert drafts[0].tokens == reference(context, k) and drafts[0].source == "draft"
        assert set(drafts.source_seconds) == {"copy", "draft"}
    finally:
        p.sources["draft"].close()


def test_the_draft_source_learns_its_acceptance_from_what_the_target_produced(tiny_dir, reference):
    k = 4
    p = make(tiny_dir, k, sources=("copy", "draft"))
    try:
        context = [5, 17, 33, 2, 60]
        chain = p.propose([Row(0, arr(context), 1)])[0]
        before = p.weights.weight("draft")
        produced = chain + [(reference(context + chain, 1)[0] + 1) % VOCAB]  # every draft token accepted
        p.propose([Row(0, arr(context + produced), len(produced))])
        assert p.weights.weight("draft") > before
        assert np.isfinite(p.weights.weight("draft"))
    finally:
        p.sources["draft"].close()


def test_a_large_sync_feed_claims_the_step_time_of_its_timeout_and_the_default_claims_none(tiny_dir):
    """pearl's catch-up inside the step (``sync_feed_tokens`` above 16) is slow by design: the adapter's
    breaker budget must cover it (``Proposer.step_time_needed``), up to pearl's own ``step_timeout_s``."""
    p = make(tiny_dir, sources=("copy", "draft"))
    try:
        assert p.step_time_needed() is None
    finally:
        p.sources["draft"].close()
    p = make(tiny_dir, sources=("copy", "draft"), draft={**EXACT, "sync_feed_tokens": 4096, "step_timeout_s": 12})
    try:
        seconds, why = p.step_time_needed()
        assert seconds == 12.0 and "sync_feed_tokens 4096" in why
    finally:
        p.sources["draft"].close()
