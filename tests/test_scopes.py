"""Scopes (docs/security.md): a source that learns across requests drafts for a request only from requests of its
own scope. Tenant B asking for what tenant A was just answered gets the drafts a cold proposer would give (no
faster than if A had never asked), while A's repeat still benefits; a row of no scope neither teaches nor is
taught; recycle's matrix, which would reveal one request's text to another, learns from the shared scope only.
"""
from __future__ import annotations

import numpy as np
import pytest
from freespec.proposers.api import SHARED_SCOPE, EngineInfo, Row, ScoredPositions
from freespec.proposers.copy import CopyOptions, CopyProposer
from freespec.proposers.hybrid import HybridOptions, HybridProposer
from freespec.proposers.recycle.proposer import RecycleOptions, RecycleProposer
from freespec.proposers.suffix_tree import SuffixOptions, SuffixTreeProposer
from freespec.vllm_plugins.request_ids import scope_of

A, B = scope_of("tenant-a"), scope_of("tenant-b")
ANSWER = np.random.default_rng(66).integers(100, 900, 48).astype(np.int32)  # what A was answered


def copy_source():
    return CopyProposer(CopyOptions(adaptive=False), 4)


def suffix_source():
    return SuffixTreeProposer(SuffixOptions(min_token_prob=0.0), 4)


def hybrid():
    p = HybridProposer(HybridOptions(sources=("suffix", "copy", "recycle")), 4)
    p.bind(EngineInfo(vocab_size=1000))
    return p


MAKERS = {"copy": copy_source, "suffix": suffix_source, "hybrid": hybrid}


def answer(p, key: int, scope, prompt: list[int], output: np.ndarray) -> None:
    """A request decoded to its end and gone: prefill and a first token, then the rest of its output."""
    seq = np.concatenate([np.asarray(prompt, dtype=np.int32), output])
    p.propose([Row(key, seq[: len(prompt) + 1], 1, scope)])
    p.propose([Row(key, seq, len(output) - 1, scope)])
    p.release(key)


def ask(p, key: int, scope) -> list[int]:
    """A new request whose output so far is the first tokens of A's answer: what is drafted next."""
    seq = np.concatenate([np.asarray([7, 7, 7], dtype=np.int32), ANSWER[:8]])
    return p.propose([Row(key, seq, 1, scope)])[0]


@pytest.mark.parametrize("kind", MAKERS)
def test_another_tenant_gets_a_cold_proposers_drafts_and_the_same_tenant_benefits(kind):
    cold = ask(MAKERS[kind](), 9, B)
    p = MAKERS[kind]()
    answer(p, 1, A, [1, 2, 3], ANSWER)
    assert ask(p, 2, B) == cold
    p.release(2)
    again = ask(p, 3, A)
    assert again and again == ANSWER[8 : 8 + len(again)].tolist() and again != cold


@pytest.mark.parametrize("kind", MAKERS)
def test_requests_without_a_salt_share_one_scope_and_a_row_of_no_scope_learns_nothing(kind):
    p = MAKERS[kind]()
    answer(p, 1, SHARED_SCOPE, [1, 2, 3], ANSWER)
    assert ask(p, 2, SHARED_SCOPE)[:2] == ANSWER[8:10].tolist()  # as before scopes: shared
    p.release(2)
    cold = ask(MAKERS[kind](), 9, None)
    assert ask(p, 3, None) == cold  # a row of no scope drafts from nothing learned
    q = MAKERS[kind]()
    answer(q, 1, None, [1, 2, 3], ANSWER)  # ... and teaches nothing
    assert ask(q, 2, SHARED_SCOPE) == ask(MAKERS[kind](), 9, SHARED_SCOPE)


def scored(token: int, next_tokens: list[int], scope) -> ScoredPositions:
    ids = np.asarray([next_tokens], dtype=np.int32)
    return ScoredPositions(np.asarray([token], dtype=np.int32), ids, np.full(ids.shape, 0.9, dtype=np.float32),
                           [scope])


def recycle():
    p = RecycleProposer(RecycleOptions(adaptive=False), 4)
    p.bind(EngineInfo(vocab_size=1000))
    return p


def test_recycles_matrix_reveals_a_requests_text_so_it_learns_from_the_shared_scope_only():
    row = [Row(1, np.asarray([3, 4, 5], dtype=np.int32), 1, SHARED_SCOPE)]
    cold = recycle().propose(row)
    shared = recycle()
    # A request's text: after token 5 the target predicted 421 (in that request's context) ...
    shared.observe(scored(5, [421, 422], SHARED_SCOPE))
    # ... and another request ending in 5 is drafted 421: the matrix carries one request's text to another.
    assert shared.propose(row)[0][:1] == [421] and cold == [[]]
    salted = recycle()
    salted.observe(scored(5, [421, 422], A))
    assert salted.propose(row) == cold  # a salted request teaches nothing
    assert salted.propose([Row(2, np.asarray([3, 4, 5], dtype=np.int32), 1, A)]) == [[]]  # nor is drafted for


def test_all_scopes_together_stay_within_the_suffix_sources_bounds():
    p = SuffixTreeProposer(SuffixOptions(max_cached_requests=5, max_cached_tokens=100), 4)
    for key in range(40):
        answer(p, key, scope_of(f"t{key % 9}"), [1, 2], np.arange(key, key + 30, dtype=np.int32))
    held = sum(len(v) for v in p._cached.values())
    assert held <= 5 and p._cached_tokens <= 100
    assert len(p._caches) <= 5  # a scope holding nothing is dropped
    assert sum(len(c.cached_requests) for c in p._caches.values()) == held


def test_the_adapter_passes_each_rows_scope_by_the_scope_option():
    from adapter_helpers import adapter_for

    seen = []
    for mode, want in [("global", SHARED_SCOPE), ("none", None), ("salt", None)]:  # salt: no runner here
        adapter = adapter_for({"plugin": "copy", "num_speculative_tokens": 4, "scope": mode})
        original = adapter.proposer.draft
        adapter.proposer.draft = lambda rows, step, original=original: seen.append([r.scope for r in rows]) or \
            original(rows, step)
        tokens = np.zeros((2, 16), dtype=np.int32)
        adapter.propose([[1], [2]], np.asarray([5, 6]), tokens)
        assert seen[-1] == [want, want], mode
    assert adapter_for({"plugin": "copy", "num_speculative_tokens": 4}).scope == "salt"  # the default


def test_a_bad_scope_is_refused_naming_the_option():
    from freespec.vllm_plugins.frontend import translate

    with pytest.raises(Exception, match="'scope'.*one of \\['salt', 'global', 'none'\\]"):
        translate({"plugin": "copy", "num_speculative_tokens": 4, "scope": "tenant"}, None)
