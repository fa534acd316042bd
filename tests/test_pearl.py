"""The pearl proposer with a tiny randomly initialised transformers model (CPU, seconds)."""
import json
import os
import random
import threading

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from freespec.proposers.base import EngineInfo, Row, StepContext  # noqa: E402
from freespec.proposers.pearl.proposer import PearlOptions, PearlProposer  # noqa: E402
from freespec.proposers.pearl.draft import TorchDraftModel, parse_cores  # noqa: E402
from freespec.proposers.pearl.state import Feed  # noqa: E402
from freespec.vllm_plugins.frontend import translate, validate_options  # noqa: E402
from pearl_helpers import VOCAB, arr, make  # noqa: E402


def target_from(rng_seed, p_reject):
    """A scripted target: the reference draft's token, except at pseudo-random positions."""
    def verify(context, chain, reference):
        seq = list(context)
        for tok in chain:
            # Seeded from a string, not hash(): str hashing is salted per process (PYTHONHASHSEED), and a run
            # whose salt happened to reject nothing once failed the "rollbacks really happened" check.
            if random.Random(f"{rng_seed}-{len(seq)}").random() < p_reject:
                break
            seq.append(tok)
        # Bonus: usually the draft's own next token (so post-verify can hit), sometimes another.
        nxt = reference(seq, 1)[0]
        if random.Random(f"{rng_seed}-{len(seq)}-bonus").random() < p_reject:
            nxt = (nxt + 1) % VOCAB
        return seq + [nxt]
    return verify


@pytest.mark.parametrize("wait", [True, False])
def test_drafts_equal_a_fresh_greedy_run_after_rollbacks(tiny_dir, reference, wait):
    """Batched, cached, rolled back and extended in the background: every chain is the uncached greedy chain."""
    k = 4
    p = make(tiny_dir, "thread", k=k)
    try:
        rng = random.Random(1)
        verify = target_from(7, p_reject=0.35)
        contexts = {key: [rng.randrange(VOCAB) for _ in range(rng.randint(3, 12))] for key in range(3)}
        num_new = dict.fromkeys(contexts, 1)
        for step in range(8):
            keys = list(contexts)
            rng.shuffle(keys)  # vLLM reorders rows between steps
            chains = p.propose([Row(key, arr(contexts[key]), num_new[key]) for key in keys])
            for key, chain in zip(keys, chains):
                assert chain == reference(contexts[key], k), (step, key)
                new = verify(contexts[key], chain, reference)
                num_new[key], contexts[key] = len(new) - len(contexts[key]), new
            if wait:
                assert p.wait_idle()
        stats = p.stats()
        assert stats["misses"] > 0 and stats["rolled_back_tokens"] > 0  # rollbacks really happened
        if wait:
            assert stats["hits"] > 0
    finally:
        p.close()


def test_post_verify_hit_returns_the_precomputed_continuation(tiny_dir, reference):
    k = 3
    p = make(tiny_dir, "thread", k=k)
    try:
        ctx = [5, 17, 33, 2]
        chain = p.propose([Row(0, arr(ctx), 1)])[0]
        assert p.wait_idle()
        forwards = p.stats()["sync_forwards"]
        st = p.drafter.states[0]
        bonus, precomputed = st.preds[k], st.preds[k + 1 : 2 * k + 1]
        ctx2 = ctx + chain + [bonus]  # the target accepted the chain and produced the predicted bonus
        assert p.propose([Row(0, arr(ctx2), k + 1)])[0] == precomputed == reference(ctx2, k)
        stats = p.stats()
        assert stats["sync_forwards"] == forwards and stats["hits"] == 1  # nothing drafted in the step
    finally:
        p.close()


def test_joined_batch_matches_one_request_at_a_time(tiny_dir, reference):
    """The left-padded batch gives each request the tokens and probabilities it gets alone."""
    m = TorchDraftModel.load(tiny_dir)
    solo = TorchDraftModel.load(tiny_dir)
    rng = random.Random(3)
    seqs = {key: [rng.randrange(VOCAB) for _ in range(n)] for key, n in [(0, 3), (1, 20), (2, 9)]}
    for key, s in seqs.items():
        s.append(m.forward([Feed(key, 0, list(s))])[0][0])
        solo.forward([Feed(key, 0, s[:-1])])
    for _ in range(5):
        feeds = [Feed(key, len(s) - 1, [s[-1]]) for key, s in seqs.items()]
        joined = m.forward(feeds)
        for f, (tok, prob) in zip(feeds, joined):
            tok1, prob1 = solo.forward([f])[0]
            assert tok == tok1 == reference(seqs[f.key], 1)[0]
            assert prob == pytest.approx(prob1, abs=1e-5)
            seqs[f.key].append(tok)
    # Roll one request back inside the joined batch; it is split out and continues alone.
    key = 1
    seqs[key] = seqs[key][:-3]
    m.truncate(key, len(seqs[key]) - 1)
    tok = m.forward([Feed(key, len(seqs[key]) - 1, [seqs[key][-1]])])[0][0]
    assert tok == reference(seqs[key], 1)[0]
    seqs[key].append(tok)
    assert m.cached_tokens() == sum(len(s) - 1 for s in seqs.values())
    assert m.kv_bytes() == m.cached_tokens() * m.kv_bytes_per_token()


def test_memory_bounds_are_respected(tiny_dir):
    k = 2
    p = make(tiny_dir, "thread", k=k, max_requests=2, max_cached_tokens=60)
    try:
        rng = random.Random(0)
        contexts = {key: [rng.randrange(VOCAB) for _ in range(10)] for key in range(4)}
        for step in range(6):
            keys = [(step + i) % 4 for i in range(3)]  # three of four requests per step
            chains = p.propose([Row(key, arr(contexts[key]), 1) for key in keys])
            p.wait_idle()
            assert p.draft_model.cached_requests() <= 2
            assert p.draft_model.cached_tokens() <= 60
            assert p.draft_model.kv_bytes() <= 60 * p.draft_model.kv_bytes_per_token()
            assert sum(1 for c in chains if c) <= 2
            for key, chain in zip(keys, chains):
                contexts[key] = contexts[key] + [rng.randrange(VOCAB)]
        assert p.stats()["evictions"] > 0 and p.stats()["refused"] > 0
        assert p.state_bytes() == p.draft_model.weight_bytes() + p.draft_model.kv_bytes()
    finally:
        p.close()


def test_release_frees_the_request_cache(tiny_dir):
    p = make(tiny_dir, "thread")
    try:
        p.propose([Row(0, arr([1, 2, 3]), 1), Row(1, arr([4, 5, 6]), 1)])
        p.wait_idle()
        assert p.draft_model.cached_requests() == 2
        p.release(0)
        p.propose([Row(1, arr([4, 5, 6, 7]), 1)])
        p.wait_idle()
        assert p.draft_model.cached_requests() == 1 and set(p.drafter.states) == {1}
    finally:
        p.close()


def test_adaptive_defaults_stay_within_k(tiny_dir):
    p = PearlProposer(PearlOptions(draft_model=tiny_dir, placement="thread"), 5)
    p.bind(EngineInfo(vocab_size=VOCAB))
    try:
        ctx = list(range(10))
        for _ in range(4):
            chain = p.propose([Row(0, arr(ctx), 1)])[0]
            assert len(chain) <= 5 and all(0 <= t < VOCAB for t in chain)
            ctx = ctx + [7]  # the target rejects every draft token
    finally:
        p.close()


def test_the_load_aware_bar_reaches_the_draft_thread(tiny_dir, reference):
    p = make(tiny_dir, "thread", k=3)
    try:
        # a full machine: only certain tokens pay; a tiny random model is never certain
        assert p.propose([Row(0, arr([1, 2, 3]), 1)], StepContext(token_cost=1.0)) == [[]]
        assert p.stats()["policy_cut_tokens"] == 3
        # an idle accelerator: the whole chain
        assert p.propose([Row(1, arr([4, 5, 6]), 1)], StepContext(token_cost=0.0))[0] == reference([4, 5, 6], 3)
    finally:
        p.close()


# --------------------------------------------------------------------------- options and errors


def test_pearl_config_validates_through_the_front_end(tiny_dir):
    spec, extra = translate(
        {"plugin": "pearl", "num_speculative_tokens": 4, "draft_model": tiny_dir, "draft_cores": "0"}, None
    )
    opts = extra["freespec"]["options"]
    assert extra["freespec"]["plugin"] == "pearl" and opts["draft_model"] == tiny_dir
    assert opts["min_confidence"] == 0.1 and opts["device"] == "cpu"
    assert validate_options("pearl", opts).draft_cores == "0"  # the worker validates the same dict again


@pytest.mark.parametrize(
    "options, message",
    [
        ({"draft_model": "/nonexistent/draft"}, r"option 'draft_model'.*neither a checkpoint directory"),
        ({"draft_model": "no-such-model"}, r"option 'draft_model'.*smollm2-135m-instruct"),
        ({}, r"option 'draft_model'"),
        ({"draft_model": "TINY", "device": "gpu"}, r"option 'device'"),
        ({"draft_model": "TINY", "draft_cores": "1-x"}, r"option 'draft_cores'.*CPU list"),
        ({"draft_model": "TINY", "draft_cores": "4096"}, r"option 'draft_cores'.*do not exist"),
        ({"draft_model": "TINY", "min_confidence": 2}, r"option 'min_confidence'"),
        ({"draft_model": "TINY", "colour": 1}, r"unknown option 'colour'"),
    ],
)
def test_bad_options_are_refused_naming_the_field(tiny_dir, options, message):
    if options.get("draft_model") == "TINY":
        options = {**options, "draft_model": tiny_dir}
    with pytest.raises(ValueError, match=message):
        validate_options("pearl", options)


def test_unloadable_draft_model_fails_at_construction_naming_it(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 10}))
    with pytest.raises(ValueError, match=r"option 'draft_model'.*cannot be loaded"):
        PearlProposer(PearlOptions(draft_model=str(tmp_path), placement="thread"), 4)


def test_directory_without_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"without config.json"):
        validate_options("pearl", {"draft_model": str(tmp_path)})


def test_other_vocabulary_is_refused_at_bind(tiny_dir):
    p = PearlProposer(PearlOptions(draft_model=tiny_dir, placement="thread"), 4)
    try:
        with pytest.raises(ValueError, match=r"option 'draft_model'.*vocabulary of 96 tokens.*has 151936"):
            p.bind(EngineInfo(vocab_size=151936, model="qwen"))
    finally:
        p.close()


def test_other_tokenizer_is_refused_at_bind(tiny_dir, monkeypatch):
    import freespec.proposers.pearl.proposer as pearl

    monkeypatch.setattr(pearl, "tokenizer_dir_fingerprint", lambda path: "sha256:" + "a" * 64)
    p = PearlProposer(PearlOptions(draft_model=tiny_dir, min_confidence=0.0, placement="thread"), 4)
    try:
        with pytest.raises(ValueError, match=r"different tokenizer"):
            p.bind(EngineInfo(vocab_size=VOCAB, tokenizer_fingerprint=lambda: "sha256:" + "b" * 64))
        # Same tokenizer, padded to another size: accepted, drafts limited to the target's ids.
        monkeypatch.setattr(pearl, "tokenizer_dir_fingerprint", lambda path: "sha256:" + "b" * 64)
        p.bind(EngineInfo(vocab_size=50, tokenizer_fingerprint=lambda: "sha256:" + "b" * 64))
        chain = p.propose([Row(0, arr([1, 2, 3]), 1)])[0]
        assert chain and all(t < 50 for t in chain)
    finally:
        p.close()


def test_parse_cores():
    assert parse_cores("1") == {1}
    assert parse_cores("2-3") == {2, 3}
    assert parse_cores("0, 2-4") == {0, 2, 3, 4}
    for bad in ("", "a", "3-1", "1-", "-1"):
        with pytest.raises(ValueError):
            parse_cores(bad)


# --------------------------------------------------------------------------- the thread


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_draft_thread_pins_itself_and_leaves_the_callers_threads_alone(tiny_dir):
    before = torch.get_num_threads()
    core = min(os.sched_getaffinity(0))
    p = make(tiny_dir, "thread", draft_cores=str(core), draft_threads=1)
    try:
        assert os.sched_getaffinity(p.worker._thread.native_id) == {core}
        assert torch.get_num_threads() == before
        seen = []
        t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        t.start()
        t.join()
        assert seen == [before]  # threads started later do not inherit the draft's count
        assert os.sched_getaffinity(0) != {core} or len(os.sched_getaffinity(0)) == 1
    finally:
        p.close()


def test_errors_in_the_draft_thread_reach_the_caller_and_reset_state(tiny_dir):
    p = make(tiny_dir, "thread")
    try:
        p.propose([Row(0, arr([1, 2, 3]), 1)])
        p.wait_idle()
        with pytest.raises(Exception):
            p.propose([Row(1, arr([VOCAB + 50, 1]), 1)])  # an id the embedding does not have
        assert not p.drafter.states  # everything dropped: no half-updated cache survives
        assert p.propose([Row(0, arr([1, 2, 3, 4]), 1)])[0]  # and it keeps working
    finally:
        p.close()


def test_a_stopped_draft_thread_raises_instead_of_hanging_the_step(tiny_dir):
    p = make(tiny_dir, "thread")
    p.close()
    with pytest.raises(RuntimeError, match="draft thread has stopped"):
        p.propose([Row(0, arr([1, 2, 3]), 1)])
