"""The suffix source: arctic-inference's SuffixDecodingCache on real token arrays, with learned acceptance."""
import logging

import numpy as np
import pytest
from freespec.proposers import hybrid as hybrid_module
from freespec.proposers import suffix_tree
from freespec.proposers.base import Row, StepContext
from freespec.proposers.hybrid import DEFAULT_SOURCES, HybridOptions
from freespec.proposers.suffix_tree import SuffixOptions, SuffixTreeProposer
from freespec.scorers.calibration import TokenCalibration
from pydantic import ValidationError

pytestmark = pytest.mark.skipif(not suffix_tree.available()[0], reason="arctic-inference not installed")


def row(key, tokens, num_new=1):
    return Row(key, np.asarray(tokens, dtype=np.int32), num_new)


def make(**opts):
    return SuffixTreeProposer(SuffixOptions(**opts), 4)


def test_version_window():
    assert suffix_tree._version_tuple("0.1.1") == (0, 1, 1)
    assert suffix_tree._version_tuple("0.1.10.dev3") == (0, 1, 10)
    low, high = suffix_tree.SUPPORTED
    assert low <= suffix_tree._version_tuple("0.1.1") < high
    assert suffix_tree._version_tuple("0.3.0") < high and not suffix_tree._version_tuple("0.4.0") < high
    assert not low <= suffix_tree._version_tuple("0.1.0")


def test_an_unsupported_version_is_refused_by_name_and_the_default_goes_on_without_it(monkeypatch, caplog):
    monkeypatch.setattr(suffix_tree.metadata, "version", lambda name: "0.4.1")
    ok, why = suffix_tree.available()
    assert not ok and "0.4.1" in why
    with pytest.raises(ValidationError, match='sources: "suffix" cannot run here: arctic-inference'):
        HybridOptions(sources=("suffix", "copy"))
    with pytest.raises(RuntimeError, match="needs arctic-inference"):
        make()
    monkeypatch.setattr(hybrid_module, "_warned_default", False)
    with caplog.at_level(logging.WARNING, logger="freespec"):
        assert HybridOptions().chosen_sources() == tuple(s for s in DEFAULT_SOURCES if s != "suffix")
        HybridOptions().chosen_sources()
    assert sum("without its suffix source" in r.message for r in caplog.records) == 1


def test_drafts_the_continuation_from_the_request_own_prompt():
    p = make()
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 40, 41, 5, 6, 7]
    draft = p.propose([row(0, prompt + [8])])[0]  # the first output token repeats the prompt's "5 6 7 8"
    assert draft[:3] == [9, 10, 11]


def test_partial_prefill_rows_get_nothing_and_start_nothing():
    p = make()
    assert p.propose([row(0, [1, 2, 3, 1, 2], num_new=0)]) == [[]]
    assert 0 not in p._live


def test_a_departed_request_output_is_drafted_for_the_next_one():
    p = make(min_token_gain=0.0)
    answer = [70, 71, 72, 73, 74, 75, 76, 77]
    tokens = [1, 2, 3]
    for t in answer:  # request 0 generates its answer one token per step
        tokens.append(t)
        p.propose([row(0, tokens)])
    p.release(0)
    assert 0 not in p.cache.active_requests and 0 in p.cache.cached_requests
    draft = p.propose([row(1, [9, 9, 70, 71, 72])])[0]  # a new request starts the same way
    assert draft[:2] == [73, 74]


def test_global_cache_is_bounded_by_max_cached_requests():
    p = make(max_cached_requests=2)
    for key in range(5):
        p.propose([row(key, [key, 50 + key, 60 + key])])
        p.release(key)
    assert len(p.cache.cached_requests) <= 2
    assert p.state_bytes() > 0


def test_learns_from_what_the_target_produced_even_when_its_chain_was_not_verified():
    p = make()
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7]
    tokens, _ = p.chain(row(0, prompt + [8]))
    assert tokens[:2] == [9, 10]
    cells = p._live[0].cells
    before = p.calibration.estimate(cells)[0]
    # The target went on with 30, not 9 (whatever was drafted): the first token's cell loses.
    p.chain(row(0, prompt + [8, 30]))
    assert p.calibration.estimate(cells)[0] < before
    # And a chain that is right gains.
    calibration = TokenCalibration()
    cells = TokenCalibration.cells([1.0, 1.0], 5)
    start = calibration.estimate(cells)
    calibration.observe(cells, 2, 2)
    assert all(after > before for after, before in zip(calibration.estimate(cells), start))


def test_a_high_bar_cuts_the_draft_and_a_low_one_keeps_it():
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 40, 41, 5, 6, 7, 8]
    p = make()
    assert p.propose([row(0, prompt)], StepContext(token_cost=0.999)) == [[]]
    p = make()
    assert len(p.propose([row(0, prompt)], StepContext(token_cost=0.0))[0]) >= 2


def test_a_short_match_drafts_longer_than_vllms_defaults_and_the_bar_still_cuts_it():
    # "50" is the only match (one token): vLLM's suffix defaults (max_spec_factor 1, min_token_prob 0.1) draft
    # one token from it; the source's defaults offer up to K and leave the cut to the goodput bar.
    tokens = [50, 1, 2, 3, 4, 5, 6, 7, 8, 60, 50]
    p = make()
    assert p.propose([row(0, tokens)], StepContext(token_cost=0.0)) == [[1, 2, 3, 4]]
    p = make(max_spec_factor=1.0, min_token_prob=0.1)
    assert p.propose([row(0, tokens)], StepContext(token_cost=0.0)) == [[1]]
    p = make()
    assert len(p.propose([row(0, tokens)], StepContext(token_cost=0.5))[0]) < 4


def test_global_cache_is_bounded_by_max_cached_tokens_oldest_first():
    p = make(min_token_gain=0.0, max_cached_tokens=30)
    for key in range(5):  # five departed requests, each 13 tokens held: a 3-token prompt's tail, 10 output tokens
        tokens = [key, 1, 2]
        for t in range(10):
            tokens.append(100 * (key + 1) + t)
            p.propose([row(key, tokens)])
        p.release(key)
    assert sorted(p.cache.cached_requests) == [3, 4]  # 26 tokens held; a third response would make 39
    assert p._cached_tokens == 26
    assert p.propose([row(9, [7, 7, 500, 501, 502])])[0][:2] == [503, 504]  # the newest still drafts
    assert p.propose([row(8, [7, 7, 100, 101, 102])])[0] == []  # the oldest was evicted


def test_the_token_bound_keeps_the_newest_response_even_when_it_alone_is_larger():
    p = make(max_cached_tokens=5)
    tokens = [1, 2, 3]
    for t in range(10):
        tokens.append(200 + t)
        p.propose([row(0, tokens)])
    p.release(0)
    assert list(p.cache.cached_requests) == [0]


def test_the_token_count_forgets_responses_evicted_by_count():
    p = make(max_cached_requests=2, max_cached_tokens=1000)
    for key in range(5):
        p.propose([row(key, [key, 50 + key, 60 + key])])
        p.propose([row(key, [key, 50 + key, 60 + key, 70 + key])])
        p.release(key)
    assert len(p.cache.cached_requests) == 2
    # 4 tokens each: the 2-token prompt's tail, then 2 output tokens (the first row's last token, then one)
    assert p._cached == {"": {3: 4, 4: 4}} and p._cached_tokens == 8


def test_a_key_that_serves_a_new_request_counts_once_toward_the_bound():
    p = make(max_cached_requests=2, max_cached_tokens=1000)
    for key, first in ((0, 10), (0, 20), (1, 30)):  # key 0 departs, serves a new request, departs again
        p.propose([row(key, [first, first + 1, first + 2])])
        p.propose([row(key, [first, first + 1, first + 2, first + 3])])
        p.release(key)
    assert sorted(p.cache.cached_requests) == [0, 1]  # two outputs held: within max_cached_requests
    assert p._cached_count == 2


def test_calibration_cells_are_the_probability_match_and_depth_buckets():
    from freespec.scorers.tuning import CALIBRATION_DEPTH_EDGES, CALIBRATION_MATCH_EDGES, CALIBRATION_PROB_EDGES

    rng = np.random.default_rng(0)
    for _ in range(200):
        cond = rng.uniform(0, 1.2, size=int(rng.integers(1, 9))).tolist()
        match = int(rng.integers(0, 30))
        expected = [
            (np.searchsorted(CALIBRATION_PROB_EDGES, c, side="right") * (len(CALIBRATION_MATCH_EDGES) + 1)
             + np.searchsorted(CALIBRATION_MATCH_EDGES, match, side="right")) * (len(CALIBRATION_DEPTH_EDGES) + 1)
            + np.searchsorted(CALIBRATION_DEPTH_EDGES, depth, side="right")
            for depth, c in enumerate(cond)
        ]
        assert TokenCalibration.cells(cond, match) == expected
    # each cell starts at the tree's probability (capped at 0.9): a low one low, a near-certain one high
    calibration = TokenCalibration()
    low, high = calibration.estimate(TokenCalibration.cells([0.1, 1.0], 5))
    assert low == pytest.approx(0.15) and high == pytest.approx(0.9)


def serve_answer(p, key, prompt, answer):
    tokens = list(prompt)
    for t in answer:  # the first step after the prefill brings the prompt and one sampled token
        tokens.append(t)
        p.propose([row(key, tokens)], StepContext(token_cost=0.0))
    p.release(key)


@pytest.mark.parametrize("tail", [16, 0])
def test_a_prompt_answered_before_has_that_answer_drafted_from_its_first_token(tail):
    # Both answers open with 7, the first one twice as often: from its first token the output alone matches
    # [7] and drafts the frequent answer; with the prompt's tail learned, [..., 50, 7] is this prompt's own.
    p = make(min_token_gain=0.0, prompt_tail=tail)
    often, repeated = [7] + list(range(100, 110)), [7] + list(range(200, 210))
    serve_answer(p, 0, [1, 2, 3, 40], often)
    serve_answer(p, 1, [1, 2, 3, 41], often)
    serve_answer(p, 2, [1, 2, 3, 50], repeated)
    draft = p.propose([row(3, [1, 2, 3, 50, 7])], StepContext(token_cost=0.0))[0]
    assert draft[:4] == ([200, 201, 202, 203] if tail else [100, 101, 102, 103])
    assert p._cached_tokens == 3 * (11 + min(tail, 4))  # the tail counts toward max_cached_tokens


@pytest.mark.parametrize("tail", [4, 0])
def test_a_repeated_answer_is_followed_where_the_tree_would_take_a_more_frequent_continuation(tail):
    # max_tree_depth 2: after [5, 6] the tree has seen 100 twice and 200 once; the repeated prompt's answer
    # went on with 200, and the request, asking it again, has repeated that answer so far.
    p = make(min_token_gain=0.0, prompt_tail=tail, max_tree_depth=2)
    answer = [7, 5, 6, 200, 201, 202, 203, 204]
    serve_answer(p, 0, [1, 2, 3, 40], [9, 5, 6, 100, 101, 102, 103, 104])
    serve_answer(p, 1, [1, 2, 3, 41], [9, 5, 6, 100, 101, 102, 103, 104])
    serve_answer(p, 2, [1, 2, 3, 50], answer)
    tokens = [1, 2, 3, 50, 7]
    for t in answer[1:3]:
        p.propose([row(3, tokens)], StepContext(token_cost=0.0))
        tokens.append(t)
    draft = p.propose([row(3, tokens)], StepContext(token_cost=0.0))[0]
    assert draft[:4] == [200, 201, 202, 203] if tail else draft[:1] == [100]  # the tree: 2-token paths
    # another scope never follows this one's answers
    other = p.propose([Row(4, np.asarray(tokens, dtype=np.int32), 1, "tenant-b")], StepContext(token_cost=0.0))[0]
    assert other == []


def test_answers_loaded_from_a_file_are_followed_and_a_purged_scope_is_not():
    p = make(min_token_gain=0.0, max_tree_depth=2, prompt_tail=4)  # the key: 4 prompt tokens and the first

    def asked_again(key):  # the prompt [.., 1, 2, 3, 50] again, its answer so far [7, 5, 6]
        tokens = [9, 1, 2, 3, 50, 7]
        for t in (5, 6):
            p.propose([Row(key, np.asarray(tokens, dtype=np.int32), 1, "tenant-a")], StepContext(token_cost=0.0))
            tokens.append(t)
        draft = p.propose([Row(key, np.asarray(tokens, dtype=np.int32), 1, "tenant-a")], StepContext(token_cost=0.0))
        p.release(key)
        return draft[0]

    p._seed([np.array([1, 2, 3, 50, 7, 5, 6, 200, 201, 202], dtype=np.int32)], "tenant-a")
    assert asked_again(1)[:3] == [200, 201, 202]
    p._forget("tenant-a")
    assert p.known.tokens == 0
    assert asked_again(2)[:3] != [200, 201, 202]
