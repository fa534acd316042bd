"""The pearl draft-state machine against a scripted draft model and a scripted target (no torch)."""
import random

import numpy as np
import pytest

from freespec.proposers.base import Row
from freespec.proposers.pearl.state import Feed, PearlDrafter, RequestDraft

V = 50  # vocabulary of the scripted models


def draft_next(prefix) -> tuple[int, float]:
    """The scripted draft model: a deterministic function of the *whole* prefix, with a confidence."""
    h = 17
    for t in prefix:
        h = (h * 1_000_003 + int(t) + 1) % 2_147_483_647
    return h % V, ((h >> 8) % 100) / 100.0


def greedy(prefix, n):
    """What a fresh draft model (no cache) drafts after ``prefix``: n tokens and their confidences."""
    seq, toks, confs = list(prefix), [], []
    for _ in range(n):
        t, c = draft_next(seq)
        toks.append(t)
        confs.append(c)
        seq.append(t)
    return toks, confs


class ScriptedDraft:
    """A DraftBackend whose 'KV cache' is the list of tokens fed; predictions come from what was really fed."""

    def __init__(self):
        self.caches: dict[int, list[int]] = {}
        self.forwards: list[list[Feed]] = []

    def forward(self, feeds):
        self.forwards.append(list(feeds))
        assert len({f.key for f in feeds}) == len(feeds), "a request fed twice in one forward"
        out = []
        for f in feeds:
            cache = self.caches.setdefault(f.key, [])
            assert len(cache) == f.start, f"request {f.key}: cache holds {len(cache)}, feed starts at {f.start}"
            assert f.tokens, "empty feed"
            cache.extend(f.tokens)
            out.append(draft_next(cache))
        return out

    def truncate(self, key, length):
        del self.caches.setdefault(key, [])[length:]

    def drop(self, key):
        self.caches.pop(key, None)

    def tokens(self):
        return sum(len(c) for c in self.caches.values())


class ScriptedTarget:
    """Agrees with the draft except where ``disagree(prefix)`` says so; then picks another token."""

    def __init__(self, disagree):
        self.disagree = disagree

    def next(self, prefix):
        t, _ = draft_next(prefix)
        return (t + 1) % V if self.disagree(prefix) else t

    def verify(self, context, chain):
        """vLLM's greedy verification: the accepted prefix of the chain plus the target's bonus token."""
        seq = list(context)
        for tok in chain:
            if self.next(seq) != tok:
                break
            seq.append(tok)
        seq.append(self.next(seq))
        return seq


def arr(seq):
    return np.asarray(seq, dtype=np.int32)


def fixed(backend, k=4, **kw):
    """A drafter that drafts exactly k greedy tokens (no confidence stop, no adaptive budget)."""
    kw.setdefault("min_confidence", 0.0)
    kw.setdefault("adaptive_length", False)
    return PearlDrafter(backend, k, **kw)


def check_consistent(drafter, backend):
    """Each request's cache is exactly the first kv_len tokens of what the drafter believes."""
    for key, st in drafter.states.items():
        assert backend.caches.get(key, []) == st.tokens_from(0)[: st.kv_len], key
        assert st.kv_len < len(st) or len(st) == 0


def run(drafter, backend, target, contexts, steps, extend=True, order=None, check=None):
    """Drive the drafter like vLLM would; returns the chains of every step, per request."""
    contexts = {key: list(c) for key, c in contexts.items()}
    num_new = {key: 1 for key in contexts}
    history = {key: [] for key in contexts}
    for step in range(steps):
        keys = list(contexts) if order is None else order(step, list(contexts))
        rows = [Row(key, arr(contexts[key]), num_new[key]) for key in keys]
        chains = drafter.step(rows)
        check_consistent(drafter, backend)
        for key, chain in zip(keys, chains):
            if check is not None:
                check(drafter, key, contexts[key], chain)
            history[key].append(chain)
            new = target.verify(contexts[key], chain)
            num_new[key] = len(new) - len(contexts[key])
            contexts[key] = new
        if extend:
            assert drafter.extend() is True
            check_consistent(drafter, backend)
    return history, contexts


def expect_greedy(k):
    def check(drafter, key, context, chain):
        assert chain == greedy(context, k)[0], (key, len(context))
    return check


# --------------------------------------------------------------------------- post-verify


def test_all_accepted_every_next_chain_comes_from_post_verify():
    backend = ScriptedDraft()
    d = fixed(backend)
    target = ScriptedTarget(lambda prefix: False)  # the target is the draft model
    run(d, backend, target, {0: [3, 1, 4, 1, 5]}, steps=6, check=expect_greedy(4))
    # First step drafts 4 tokens itself; every later chain was drafted during verification.
    assert d.stats.hits == 5 and d.stats.misses == 0
    assert d.stats.sync_forwards == 4
    assert d.stats.background_forwards == 6 * 5  # bonus prediction + 4 chain tokens, per step


def test_hit_returns_the_precomputed_continuation_without_drafting():
    backend = ScriptedDraft()
    d = fixed(backend, k=3)
    ctx = [7, 7, 2]
    chain = d.step([Row(0, arr(ctx), 1)])[0]
    assert d.extend()
    st = d.states[0]
    # Post-verify drafted the bonus token and the next chain after the returned chain.
    assert st.preds == chain + greedy(ctx + chain, 4)[0]
    n_forwards = len(backend.forwards)
    ctx2 = ctx + chain + [st.preds[3]]  # the target accepted all and sampled the predicted bonus
    precomputed = st.preds[4:]
    assert d.step([Row(0, arr(ctx2), 4)])[0] == precomputed == greedy(ctx2, 3)[0]
    assert len(backend.forwards) == n_forwards  # nothing drafted in the step


def test_bonus_mismatch_rolls_back_the_extension_only():
    backend = ScriptedDraft()
    d = fixed(backend, k=3)
    ctx = [9, 8, 7, 6]
    chain = d.step([Row(0, arr(ctx), 1)])[0]
    assert d.extend()
    predicted_bonus = d.states[0].preds[3]
    other = (predicted_bonus + 1) % V
    ctx2 = ctx + chain + [other]
    assert d.step([Row(0, arr(ctx2), 4)])[0] == greedy(ctx2, 3)[0]
    assert d.stats.misses == 1
    # The cache kept context + chain (the chain's last token was fed during post-verify)
    # and dropped the fed extension (predicted bonus + 2 of the next chain).
    assert d.stats.rolled_back_tokens == 3
    check_consistent(d, backend)


@pytest.mark.parametrize("extend", [True, False])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_rejection_at_every_position_redrafts_exactly_what_a_fresh_draft_would(k, extend):
    ctx = [1, 2, 3, 4, 5, 6]
    for reject_at in range(k + 1):  # k: all accepted but another bonus token
        backend = ScriptedDraft()
        d = fixed(backend, k=k)
        target_pos = len(ctx) + reject_at  # absolute position where the target disagrees (first step's chain)
        target = ScriptedTarget(lambda prefix, p=target_pos: len(prefix) == p)
        history, final = run(d, backend, target, {0: ctx}, steps=4, extend=extend, check=expect_greedy(k))
        assert history[0][0] == greedy(ctx, k)[0]
        assert final[0][: len(ctx) + reject_at] == ctx + history[0][0][:reject_at]
        assert d.stats.misses == (1 if extend or reject_at < k else 0), reject_at


def test_rollback_truncates_the_cache_to_the_accepted_prefix():
    backend = ScriptedDraft()
    d = fixed(backend, k=4)
    ctx = [5] * 10
    chain = d.step([Row(0, arr(ctx), 1)])[0]
    d.extend()
    # The target accepts 1 draft token, then picks another token than chain[1].
    ctx2 = ctx + chain[:1] + [(chain[1] + 1) % V]
    assert d.step([Row(0, arr(ctx2), 2)])[0] == greedy(ctx2, 4)[0]
    assert backend.caches[0][: len(ctx) + 1] == ctx2[: len(ctx) + 1]
    st = d.states[0]
    assert st.kv_len == len(backend.caches[0]) and backend.caches[0] == st.tokens_from(0)[: st.kv_len]


def test_random_targets_many_requests_reordered_rows_and_interrupted_post_verify():
    """Property: whatever the target does, whenever post-verify is stopped, chains are a fresh greedy draft."""
    rng = random.Random(5)
    for trial in range(30):
        backend = ScriptedDraft()
        k = rng.randint(1, 6)
        d = fixed(backend, k=k, sync_feed_tokens=rng.choice([1, 4, 100]), prefill_chunk=rng.choice([1, 3, 8]))
        p_reject = rng.random()
        target = ScriptedTarget(lambda prefix: draft_next(list(prefix) + [99])[1] < p_reject)
        contexts = {key: [rng.randrange(V) for _ in range(rng.randint(1, 20))] for key in range(rng.randint(1, 5))}
        num_new = {key: 1 for key in contexts}
        for step in range(12):
            keys = list(contexts)
            rng.shuffle(keys)
            rows = [Row(key, arr(contexts[key]), num_new[key]) for key in keys]
            chains = d.step(rows)
            check_consistent(d, backend)
            for key, chain in zip(keys, chains):
                # A request may draft nothing while it catches up; a chain is always the fresh greedy one.
                assert chain == greedy(contexts[key], k)[0][: len(chain)] and len(chain) in (0, k)
                new = target.verify(contexts[key], chain)
                num_new[key], contexts[key] = len(new) - len(contexts[key]), new
            budget = rng.randint(0, 12)
            calls = iter(range(10_000))
            d.extend(lambda: next(calls) >= budget)  # stopped after `budget` forwards, like a new step would
            check_consistent(d, backend)
        assert d.stats.chains > 0


def test_reordered_rows_keep_each_requests_own_state():
    backend = ScriptedDraft()
    d = fixed(backend, k=3)
    target = ScriptedTarget(lambda prefix: len(prefix) % 5 == 0)
    contexts = {0: [1, 2, 3], 1: [4, 5, 6, 7], 2: [8]}
    run(d, backend, target, contexts, steps=8, order=lambda step, keys: keys[step % 3 :] + keys[: step % 3],
        check=expect_greedy(3))


# --------------------------------------------------------------------------- requests leaving, bounds


def test_request_released_mid_post_verify_is_dropped_and_others_go_on():
    backend = ScriptedDraft()
    d = fixed(backend, k=4)
    rows = [Row(0, arr([1, 2, 3]), 1), Row(1, arr([4, 5, 6]), 1)]
    d.step(rows)
    forwards = iter(range(100))

    def stop_after_release():
        if next(forwards) == 2:
            d.release(1)  # the request finishes while its extension is being drafted
        return False

    assert d.extend(stop_after_release)
    assert 1 not in d.states and 1 not in backend.caches
    assert 0 in d.states and len(d.states[0].preds) == 4 + 1 + 4
    assert all(len(f) == 1 for f in backend.forwards[-3:])  # only request 0 fed after the release


def test_released_request_is_freed_at_the_next_step():
    backend = ScriptedDraft()
    d = fixed(backend)
    d.step([Row(0, arr([1, 2]), 1), Row(1, arr([3, 4]), 1)])
    d.release(0)
    d.step([Row(1, arr([3, 4, 5]), 1)])
    assert set(d.states) == {1} and set(backend.caches) == {1}


def test_partial_prefill_rows_get_no_chain_and_no_state():
    backend = ScriptedDraft()
    d = fixed(backend)
    assert d.step([Row(0, arr([1, 2, 3]), 0)]) == [[]]
    assert not d.states and not backend.forwards


def test_long_context_is_caught_up_in_the_background_in_chunks():
    backend = ScriptedDraft()
    d = fixed(backend, k=2, sync_feed_tokens=8, prefill_chunk=16)
    ctx = list(range(40))
    assert d.step([Row(0, arr(ctx), 1)]) == [[]]
    assert d.stats.deferred == 1 and not backend.forwards
    assert d.extend()
    sizes = [len(f[0].tokens) for f in backend.forwards[:3]]
    assert sizes == [16, 16, 8]
    # Caught up and extended as if the target's next token is the predicted one.
    nxt = d.states[0].preds[0]
    ctx2 = ctx + [nxt]
    assert d.step([Row(0, arr(ctx2), 1)]) == [greedy(ctx2, 2)[0]]
    assert d.stats.hits == 1


def test_a_step_can_lower_the_catch_up_limit():
    ctx = list(range(40))
    d = fixed(ScriptedDraft(), k=2, sync_feed_tokens=4096)
    assert d.step([Row(0, arr(ctx), 1)]) == [greedy(ctx, 2)[0]]  # the option: the context is read in the step
    backend = ScriptedDraft()
    d = fixed(backend, k=2, sync_feed_tokens=4096)
    assert d.step([Row(0, arr(ctx), 1)], sync_feed_tokens=16) == [[]]  # a draft restarted after a timeout
    assert d.stats.deferred == 1 and not backend.forwards
    assert d.extend() and backend.tokens() == len(ctx) + 2  # caught up, then extended, in the background


def test_stop_request_interrupts_catch_up_between_chunks():
    backend = ScriptedDraft()
    d = fixed(backend, k=2, sync_feed_tokens=4, prefill_chunk=4)
    ctx = list(range(30))
    d.step([Row(0, arr(ctx), 1)])
    calls = iter(range(100))
    assert d.extend(lambda: next(calls) >= 2) is False
    assert d.states[0].kv_len == 8 and len(backend.caches[0]) == 8
    ctx2 = ctx + [3]  # no chain was drafted: the target produced one token
    assert d.step([Row(0, arr(ctx2), 1)]) == [[]]  # still far behind
    d.extend()
    ctx3 = ctx2 + [d.states[0].preds[0]]
    assert d.step([Row(0, arr(ctx3), 1)]) == [greedy(ctx3, 2)[0]]


def test_memory_bounds_requests_and_tokens():
    backend = ScriptedDraft()
    k = 2
    d = fixed(backend, k=k, max_requests=2, max_cached_tokens=2 * (10 + 2 * k + 1))
    target = ScriptedTarget(lambda prefix: len(prefix) % 3 == 0)
    contexts = {key: [key] * 8 for key in range(3)}
    num_new = dict.fromkeys(contexts, 1)
    for step in range(6):
        keys = [step % 3, (step + 1) % 3]  # two of the three requests each step
        rows = [Row(key, arr(contexts[key]), num_new[key]) for key in keys]
        chains = d.step(rows)
        d.extend()
        assert len(backend.caches) <= 2 and len(d.states) <= 2
        assert backend.tokens() <= d.max_cached_tokens
        for key, chain in zip(keys, chains):
            new = target.verify(contexts[key], chain)
            num_new[key], contexts[key] = len(new) - len(contexts[key]), new
    assert d.stats.evictions > 0
    # A request too long for the token bound drafts nothing and holds nothing.
    assert d.step([Row(9, arr([1] * 100), 1)]) == [[]]
    assert 9 not in backend.caches and d.stats.refused >= 1


def test_draft_position_limit_refuses_long_requests():
    backend = ScriptedDraft()
    d = fixed(backend, k=4, max_position=20)
    assert d.step([Row(0, arr([1] * 12), 1)]) == [[]]  # 12 + 2*4 + 1 > 20
    assert d.step([Row(1, arr([1] * 11), 1)]) != [[]]


# --------------------------------------------------------------------------- adaptive length


def test_confidence_stop_keeps_the_low_token_as_the_bonus_guess():
    backend = ScriptedDraft()
    ctx = [2, 4, 6]
    toks, confs = greedy(ctx, 8)
    threshold = sorted(confs)[3]  # some draft tokens fall below it
    d = PearlDrafter(backend, 8, min_confidence=threshold, adaptive_length=False)
    chain = d.step([Row(0, arr(ctx), 1)])[0]
    stop = next(i for i, c in enumerate(confs) if c < threshold)
    assert chain == toks[:stop]
    # The low-confidence prediction stays: post-verify extends from it as the predicted bonus.
    assert d.states[0].preds[: stop + 1] == toks[: stop + 1]


def test_budget_grows_after_full_acceptance_and_shrinks_after_rejection():
    st = RequestDraft(budget=4)
    st.last_chain = 4
    st.learn(num_new=5, k=8, adaptive=True)
    assert st.budget == 6
    st.last_chain = 6
    st.learn(num_new=9, k=8, adaptive=True)
    assert st.budget == 8  # bounded by k
    st.last_chain = 8
    st.learn(num_new=3, k=8, adaptive=True)
    assert st.budget == 7
    for _ in range(10):
        st.last_chain = 1
        st.learn(num_new=1, k=8, adaptive=True)
    assert st.budget == 1
    st.last_chain = 0  # no chain: no evidence
    st.learn(num_new=1, k=8, adaptive=True)
    assert st.budget == 1


def test_adaptive_chain_lengths_follow_acceptance():
    backend = ScriptedDraft()
    d = PearlDrafter(backend, 6, min_confidence=0.0, adaptive_length=True)
    reject = ScriptedTarget(lambda prefix: True)  # never accepts a draft token
    history, ctx = run(d, backend, reject, {0: [1, 2, 3]}, steps=8)
    assert [len(c) for c in history[0]] == [6, 5, 4, 3, 2, 1, 1, 1]
    accept = ScriptedTarget(lambda prefix: False)
    history, _ = run(d, backend, accept, {0: ctx[0]}, steps=4)
    # A new run() restarts with num_new=1 ("nothing accepted"): one more shrink, then growth.
    assert [len(c) for c in history[0]] == [1, 3, 5, 6]


def test_a_context_that_differs_earlier_rolls_back_to_the_common_prefix():
    """Identity can only be inferred (request_tracker); a wrong guess must cost speed, never correctness."""
    backend = ScriptedDraft()
    d = fixed(backend, k=3)
    ctx = [1, 2, 3, 4, 5, 6, 7, 8]
    d.step([Row(0, arr(ctx), 1)])
    d.extend()
    other = [1, 2, 3, 9, 9, 9, 9, 9, 9, 9]  # same key, different tokens from position 3 on
    assert d.step([Row(0, arr(other), 2)]) == [greedy(other, 3)[0]]
    assert backend.caches[0][:3] == [1, 2, 3]
    check_consistent(d, backend)


@pytest.mark.parametrize("token_cost", [0.0, 0.3, 0.6, 1.0])
def test_the_load_aware_bar_cuts_a_chain_where_its_confidence_product_falls_below_it(token_cost):
    d = fixed(ScriptedDraft(), k=6)
    ctx = [3, 1, 4, 1, 5]
    chain = d.step([Row(0, arr(ctx), 1)], token_cost=token_cost)[0]
    toks, confs = greedy(ctx, 6)
    keep, p = 0, 1.0
    for c in confs:
        p *= c
        if p < token_cost:
            break
        keep += 1
    assert chain == toks[:keep]
    assert d.stats.policy_cut_tokens == 6 - keep
    # Post-verify goes on from the cut chain: its next token is the bonus prediction.
    assert d.states[0].extend_from == len(ctx) + keep + 1


def test_without_the_policy_pearl_keeps_its_own_length_rules():
    d = fixed(ScriptedDraft(), k=6)
    assert d.step([Row(0, arr([3, 1, 4, 1, 5]), 1)])[0] == greedy([3, 1, 4, 1, 5], 6)[0]
    assert d.stats.policy_cut_tokens == 0
