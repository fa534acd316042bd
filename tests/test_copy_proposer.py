"""Behaviour of the copy proposer on token arrays (no vLLM)."""
import numpy as np
import pytest
from pydantic import ValidationError

from freespec.proposers.base import Row
from freespec.proposers.copy import CopyOptions, CopyProposer


def arr(*tokens):
    return np.array(tokens, dtype=np.int32)


def fixed(**kw):
    """A proposer that drafts the whole continuation (no acceptance estimate)."""
    return CopyProposer(CopyOptions(adaptive=False, **kw), num_speculative_tokens=4)


def test_drafts_what_followed_the_earlier_occurrence():
    p = fixed()
    assert p.propose([Row(0, arr(1, 2, 3, 4, 5, 6, 9, 9, 2, 3), 1)]) == [[4, 5, 6, 9]]


def test_nothing_when_nothing_matches():
    p = fixed()
    assert p.propose([Row(0, arr(1, 2, 3, 4, 5, 6), 1)]) == [[]]


def test_longest_match_wins_over_more_recent_shorter_one():
    # suffix "7 2 3": an old occurrence matches 3 tokens, a newer one only "2 3".
    seq = arr(7, 2, 3, 40, 41, 8, 2, 3, 50, 51, 7, 2, 3)
    assert fixed().propose([Row(0, seq, 1)]) == [[40, 41, 8, 2]]


def test_most_recent_occurrence_wins_a_tie():
    seq = arr(2, 3, 40, 9, 2, 3, 50, 9, 1, 2, 3)
    assert fixed(max_match=2).propose([Row(0, seq, 1)]) == [[50, 9, 1, 2]]


def test_draft_never_longer_than_k_or_past_the_sequence_end():
    p = CopyProposer(CopyOptions(adaptive=False), num_speculative_tokens=2)
    assert p.propose([Row(0, arr(1, 2, 3, 4, 5, 1, 2), 1)]) == [[3, 4]]
    q = fixed()
    # continuation runs into the end of the sequence: only what exists is drafted
    assert q.propose([Row(0, arr(5, 1, 2, 8, 1, 2), 1)]) == [[8, 1, 2]]


def test_partial_prefill_rows_get_no_draft():
    assert fixed().propose([Row(0, arr(1, 2, 3, 1, 2), 0)]) == [[]]


def test_incremental_updates_match_a_fresh_proposer():
    rng = np.random.default_rng(0)
    seq = rng.integers(0, 6, size=400).astype(np.int32)
    inc = fixed()
    for n in range(20, 400, 3):
        got = inc.propose([Row(0, seq[:n], 3)])
        want = fixed().propose([Row(0, seq[:n], 3)])
        assert got == want, n


def test_rows_reordered_between_steps_keep_their_own_state():
    p = fixed()
    a, b = arr(1, 2, 3, 4, 1, 2), arr(7, 8, 9, 10, 7, 8)
    assert p.propose([Row(10, a, 1), Row(11, b, 1)]) == [[3, 4, 1, 2], [9, 10, 7, 8]]
    a2, b2 = np.append(a, 3), np.append(b, 9)
    assert p.propose([Row(11, b2, 1), Row(10, a2, 1)]) == [[10, 7, 8, 9], [4, 1, 2, 3]]


def test_copies_from_a_departed_requests_output():
    p = fixed()
    answer = [60, 61, 62, 63, 64, 65, 66]
    first = arr(1, 2, 3, *answer)
    p.propose([Row(0, first[:4], 1)])  # prompt 1 2 3, first output token 60
    p.propose([Row(0, first, 6)])
    p.release(0)
    # a new request (different prompt) starts writing the same answer
    assert p.propose([Row(1, arr(9, 9, 60, 61), 1)]) == [[62, 63, 64, 65]]


def test_pool_disabled_copies_only_from_own_context():
    p = fixed(pool_tokens=0)
    p.propose([Row(0, arr(1, 2, 3, 60, 61, 62, 63, 64), 5)])
    p.release(0)
    assert p.propose([Row(1, arr(9, 9, 60, 61), 1)]) == [[]]


def test_pool_stays_within_its_token_budget():
    p = fixed(pool_tokens=100)
    for key in range(50):
        p.propose([Row(key, np.arange(key, key + 40, dtype=np.int32), 39)])
        p.release(key)
    assert sum(pool.tokens for pool in p._pools.values()) <= 100


def test_pools_of_many_scopes_stay_within_one_token_budget():
    p = fixed(pool_tokens=100)
    for key in range(50):
        p.propose([Row(key, np.arange(key, key + 40, dtype=np.int32), 39, scope=f"{key % 7:032x}")])
        p.release(key)
    assert sum(pool.tokens for pool in p._pools.values()) <= 100 and len(p._pools) <= 3


def test_released_requests_free_their_state():
    p = fixed(pool_tokens=0)
    for key in range(20):
        p.propose([Row(key, np.arange(1000, dtype=np.int32) % 97, 1)])
    assert p.state_bytes() > 0
    for key in range(20):
        p.release(key)
    assert p._seqs == {}


def simulate(proposer, truth, start, steps):
    """Drive a proposer like vLLM would, with ``truth`` as the target's output; return draft lengths."""
    n, num_new, lengths = start, 1, []
    for _ in range(steps):
        draft = proposer.propose([Row(0, truth[:n], num_new)])[0]
        accepted = 0
        while accepted < len(draft) and draft[accepted] == truth[n + accepted]:
            accepted += 1
        lengths.append(len(draft))
        num_new = accepted + 1
        n += num_new
    return lengths


def test_adaptive_length_grows_while_drafts_are_accepted():
    truth = np.tile(np.arange(10, 30, dtype=np.int32), 40)  # perfectly repetitive
    lengths = simulate(CopyProposer(CopyOptions(min_token_gain=0.3), 8), truth, 40, 30)
    assert lengths[-1] == 8 and lengths[0] < 8


def test_adaptive_length_drops_to_rare_probes_when_drafts_are_rejected():
    truth = np.random.default_rng(1).integers(0, 4, size=2000).astype(np.int32)  # copying is a coin toss
    lengths = simulate(CopyProposer(CopyOptions(min_token_gain=0.3), 8), truth, 40, 300)
    late = lengths[150:]
    assert sum(late) / len(late) < 0.5  # mostly no draft ...
    assert max(late) >= 1  # ... but it keeps probing so it can recover


@pytest.mark.parametrize(
    "bad, field",
    [({"min_match": 0}, "min_match"), ({"max_match": 1, "min_match": 3}, "max_match"), ({"colour": 1}, "colour")],
)
def test_bad_options_are_refused(bad, field):
    with pytest.raises(ValidationError, match=field):
        CopyOptions(**bad)


def test_live_requests_index_at_most_max_live_indexed_tokens_and_resume_when_one_leaves():
    import numpy as np
    from freespec.proposers.base import Row
    from freespec.proposers.copy import CopyOptions, CopyProposer

    p = CopyProposer(CopyOptions(max_live_indexed_tokens=1024), 8)
    rng = np.random.default_rng(1)
    a, b = (rng.integers(0, 1000, 900).astype(np.int32) for _ in range(2))
    p.propose([Row(1, a, 1), Row(2, b, 1)])
    assert p._seqs[1].indexed + p._seqs[2].indexed == 1024 == p._live_indexed
    p.release(1)
    p.propose([Row(2, np.append(b, 7).astype(np.int32), 1)])
    assert p._seqs[2].indexed == 900  # the rest of b indexed once a left (all but the query gram)
    assert p._live_indexed == 900


def test_a_state_dir_says_the_pool_is_not_kept_there(tmp_path, caplog):
    from freespec.proposers.api import EngineInfo
    from freespec.proposers.hybrid import HybridOptions, HybridProposer

    def warnings_binding(proposer, state_dir):
        caplog.clear()
        with caplog.at_level("WARNING", logger="freespec"):
            proposer.bind(EngineInfo(vocab_size=100, state_dir=state_dir, tokenizer_fingerprint=lambda: "t"))
        return [r.getMessage() for r in caplog.records if "copy keeps its pool" in r.getMessage()]

    assert len(warnings_binding(CopyProposer(CopyOptions(), 4), str(tmp_path))) == 1
    assert warnings_binding(CopyProposer(CopyOptions(), 4), None) == []
    assert warnings_binding(CopyProposer(CopyOptions(pool_tokens=0), 4), str(tmp_path)) == []  # no pool
    named = HybridProposer(HybridOptions(sources=("copy",)), 4)
    assert len(warnings_binding(named, str(tmp_path))) == 1  # a named source of hybrid's says so too
    # hybrid's defaults (suffix, recycle) keep their state in the folder: nothing to say
    assert warnings_binding(HybridProposer(HybridOptions(sources=("recycle",)), 4), str(tmp_path)) == []
