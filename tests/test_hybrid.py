"""The hybrid proposer: several sources, one fused chain per request."""
import numpy as np
import pytest
from freespec.proposers.base import Draft, EngineInfo, Row, ScoredPositions, StepContext
from freespec.scorers.policy import cut
from freespec.proposers import hybrid as hybrid_module
from freespec.proposers.hybrid import DEFAULT_SOURCES, HybridOptions, HybridProposer, displaced
from freespec.proposers.suffix_tree import available as suffix_available
from freespec.scorers import fusion, tuning
from freespec.proposers.api import Candidates
from freespec.scorers.controller import SourcePricing
from freespec.scorers.fusion import fuse
from pydantic import ValidationError


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
        HybridOptions(sources=("copy",), datastore="/tmp")


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
    assert p._offered == {}


def test_each_source_that_ran_reports_its_own_time():
    p = make(sources=("copy", "recycle"), price_sources=False)
    seconds = p.draft([row(0, [5, 6, 7, 8, 9, 10, 11, 5, 6, 7])], StepContext()).source_seconds
    assert set(seconds) == {"copy", "recycle"} and all(s > 0 for s in seconds.values())


def test_a_high_bar_cuts_drafts():
    p = make(sources=("copy",))
    copying = [5, 6, 7, 8, 9, 10, 11, 5, 6, 7]
    assert p.propose([row(0, copying)], StepContext(token_cost=0.99)) == [[]]


def test_a_source_that_cannot_pay_on_its_own_is_not_asked(monkeypatch):
    p = make(sources=("copy", "recycle"))
    calls = []
    for name, source in p.sources.items():
        monkeypatch.setattr(source, "candidates",
                            lambda rows, step, name=name: calls.append(name) or [None] * len(rows))
    for _ in range(30):  # recycle's drafts keep failing, copy's are accepted
        p.weights.observe({"recycle": 2}, 0)
        p.weights.observe({"copy": 2}, 2)
    p.propose([row(0, [1, 2, 3])], StepContext(token_cost=0.5))
    assert calls == ["copy"]
    assert not p.wants_target_topk()  # recycle is not asked, so nothing needs the target's top-k
    calls.clear()
    p.propose([row(0, [1, 2, 3])], StepContext(token_cost=None))  # fixed bars: every source is asked
    assert calls == ["copy", "recycle"]
    assert p.wants_target_topk()


def test_retrieval_source_offers_every_continuation_and_fuses_like_the_retrieval_plugin(tmp_path):
    from freespec.proposers.retrieval.proposer import RetrievalOptions, RetrievalProposer

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



def test_each_source_takes_its_own_options_and_a_bad_one_is_refused_naming_it():
    from freespec.proposers.copy import CopyOptions
    from freespec.vllm_plugins.frontend import FreespecConfigError, validate_options

    p = make(sources=("copy", "recycle"), copy={"min_match": 3}, recycle={"candidates": 4})
    assert p.sources["copy"].options.min_match == 3 and p.sources["recycle"].options.candidates == 4
    assert make(sources=("copy",)).sources["copy"].options == CopyOptions()  # no options: the defaults
    with pytest.raises(FreespecConfigError, match=r"plugin 'hybrid': option 'copy\.min_match': .*less than"):
        validate_options("hybrid", {"sources": ["copy"], "copy": {"min_match": 99}})
    with pytest.raises(FreespecConfigError, match=r"plugin 'hybrid': unknown option 'recycle\.colour'"):
        validate_options("hybrid", {"recycle": {"colour": 1}})
    with pytest.raises(ValidationError, match='"copy" options are given but "copy" is not among the sources'):
        HybridOptions(copy={"min_match": 3})


def test_the_retrieval_source_takes_its_options_and_hybrids_datastore(tmp_path):
    from freespec.vllm_plugins.frontend import FreespecConfigError, validate_options

    from tests.test_retrieval import write_store

    store = write_store(tmp_path / "store", [[10, 11, 12, 13]])
    source = HybridProposer(HybridOptions(sources=("retrieval",), datastore=store,
                                          retrieval={"max_continuations": 8}), 4).sources["retrieval"]
    assert (source.options.max_continuations, source.options.datastore, source.copy) == (8, store, None)
    nested = {"sources": ["retrieval"], "datastore": store,
              "retrieval": {"fuse_copy": True, "copy": {"min_match": 0}}}
    with pytest.raises(FreespecConfigError, match=r"option 'retrieval\.copy\.min_match': .*greater than"):
        validate_options("hybrid", nested)
    with pytest.raises(ValidationError, match="hybrid's \"datastore\" option"):
        HybridOptions(sources=("retrieval",), datastore=store, retrieval={"datastore": store})


needs_arctic = pytest.mark.skipif(not suffix_available()[0], reason="arctic-inference not installed")


def test_a_datastore_given_alone_adds_the_retrieval_source_to_the_defaults(tmp_path):
    from tests.test_retrieval import write_store

    store = write_store(tmp_path / "store", [[10, 11, 12, 13]])
    chosen = HybridOptions(datastore=store, retrieval={"max_continuations": 8}).chosen_sources()
    assert chosen[-1] == "retrieval" and set(chosen[:-1]) <= set(DEFAULT_SOURCES)
    assert HybridOptions(datastore=None).chosen_sources() == HybridOptions().chosen_sources()


@needs_arctic
def test_defaults_need_no_options_and_include_the_suffix_source():
    p = make()
    assert tuple(p.sources) == DEFAULT_SOURCES and "suffix" in p.sources
    assert HybridOptions(sources=("suffix",)).chosen_sources() == ("suffix",)


@needs_arctic
def test_default_drafts_a_repeat_from_the_suffix_tree():
    p = make()
    assert p.propose([row(0, [5, 6, 7, 8, 9, 10, 11, 5, 6, 7])])[0][:2] == [8, 9]


def test_a_source_learns_from_what_the_target_produced_even_when_its_chain_lost():
    p = make(sources=("copy", "recycle"))
    copying = [5, 6, 7, 8, 9, 10, 11, 5, 6, 7]
    p.propose([row(0, copying)])
    assert "copy" in p._offered[0][1]
    before = p.weights.weight("copy")
    p.propose([row(0, copying + [8, 9], num_new=2)])  # the target went on as copy said
    assert p.weights.weight("copy") > before
    before = p.weights.weight("copy")
    p.propose([row(0, copying + [8, 9, 50], num_new=1)])  # copy said 10
    assert p.weights.weight("copy") < before


def test_token_probs_stand_in_for_the_source_weight():
    sure = Candidates("suffix", np.array([[1, 2, 3]]), np.ones(1), source_weight=0.1,
                      token_probs=np.array([[0.9, 0.8, 0.1]]))
    draft, support, _ = fuse([sure], 3, 0.2)
    assert draft == [1, 2] and support == pytest.approx([0.9, 0.8])


def test_each_draft_token_comes_with_the_chance_it_and_the_ones_before_are_accepted():
    sure = Candidates("suffix", np.array([[1, 2, 3, 4]]), np.ones(1), token_probs=np.array([[0.9, 0.8, 0.5, 0.1]]))
    fused = fusion.fuse_sources({"suffix": sure}, fusion.SourceWeights(), 4, 0.05, 0.3)
    assert fused.tokens == [1, 2, 3, 4] and fused.chances == pytest.approx([0.9, 0.72, 0.36, 0.036])
    assert fused.paying == 3  # 0.036 < 0.3: the policy cuts there
    assert cut(Draft(fused.tokens, fused.chances), 0.3).tokens == [1, 2, 3]
    p = make()
    drafts = p.draft([row(0, [5, 6, 7, 8, 9, 10, 11, 5, 6, 7]), row(1, [1, 2, 3])], StepContext())
    chances = [d.chances for d in drafts]
    assert [len(c) for c in chances] == [len(d.tokens) for d in drafts] and len(drafts[0].tokens) > 0
    assert all(1 >= a >= b > 0 for a, b in zip(chances[0], chances[0][1:]))


def test_one_chain_fuses_as_the_general_descent_does():
    """A single offered chain takes a shortcut; a second source that offers only padding forces the
    general descent, which must give the same draft and supports."""
    rng = np.random.default_rng(0)
    padding = Candidates("other", np.full((1, 8), -1), np.ones(1))
    for _ in range(300):
        length = int(rng.integers(1, 9))
        chain = rng.integers(0, 50, size=(1, length))
        if rng.random() < 0.3:
            chain[0, int(rng.integers(0, length)):] = -1
        probs = rng.random((1, length)) if rng.random() < 0.7 else None
        one = Candidates("s", chain, np.array([2.0]), source_weight=float(rng.random()), token_probs=probs)
        max_len, bar = int(rng.integers(1, 9)), float(rng.random() * 0.5)
        short = fuse([one], max_len, bar)
        general = fuse([one, padding], max_len, bar)
        assert short[0] == general[0] and short[1] == pytest.approx(general[1])
        assert short[2] == {"s": general[2]["s"]} and general[2]["other"] == 0


def test_pricing_pauses_a_source_that_adds_nothing_and_resumes_it_when_it_does():
    pricing = SourcePricing(("a", "b"))
    for _ in range(tuning.MIN_EVIDENCE + 1):
        pricing.observe_step(0.05)
        pricing.observe_tokens({"a": 1, "b": 0}, 2)  # only a is ever right on its own
        for name in ("a", "b"):
            if pricing.runs(name):
                pricing.observe_cost(name, 0.001)
        pricing.step_done(tuple(n for n in ("a", "b") if pricing.runs(n)))
    assert pricing.paused() == ["b"]
    ran = []
    for _ in range(4 * tuning.PROBE_EVERY):
        pricing.observe_step(0.05)
        pricing.observe_tokens({"a": 0, "b": 1} if "b" in pricing._last_run else {"a": 0}, 2)
        run = tuple(n for n in ("a", "b") if pricing.runs(n))
        ran.append("b" in run)
        pricing.step_done(run)
    assert sum(ran[: tuning.PROBE_EVERY]) == 1  # paused: one probe
    assert pricing.paused() == ["a"] or pricing.paused() == []  # b pays again and runs
    assert all(ran[-tuning.PROBE_EVERY:])


def test_a_source_slow_next_to_the_step_is_judged_sooner_and_probed_less_often():
    """A draft model's chain on a CPU (200 ms a step against a 170 ms engine step) that adds nothing is paused
    after 16 steps, not 64, and probed about once in 59 steps, at most 2% of the time."""
    pricing = SourcePricing(("a", "draft"))
    steps = 0
    while pricing.paused() != ["draft"]:
        pricing.observe_step(0.17)
        pricing.observe_tokens({"a": 1, "draft": 0}, 2)
        for name in ("a", "draft"):
            if pricing.runs(name):
                pricing.observe_cost(name, 0.2 if name == "draft" else 0.001)
        pricing.step_done(tuple(n for n in ("a", "draft") if pricing.runs(n)))
        steps += 1
        assert steps < tuning.MIN_EVIDENCE
    assert steps == tuning.FEW_EVIDENCE + 1  # judged on the step after its 16th
    probes = 0
    for _ in range(590):
        pricing.observe_step(0.17)
        pricing.observe_tokens({"a": 1}, 2)
        run = tuple(n for n in ("a", "draft") if pricing.runs(n))
        probes += "draft" in run
        pricing.step_done(run)
    assert probes == 10  # every 59 steps: 0.2 s / (0.02 x 0.17 s)


def test_pricing_never_pauses_the_last_source():
    pricing = SourcePricing(("a",))
    for _ in range(2 * tuning.MIN_EVIDENCE):
        pricing.observe_step(0.05)
        pricing.observe_tokens({}, 1)
        pricing.observe_cost("a", 0.01)
        pricing.step_done(("a",))
    assert pricing.paused() == []


def test_hybrid_stops_running_a_source_that_never_contributes_and_resumes_it(monkeypatch):
    import time

    p = HybridProposer(HybridOptions(sources=("copy", "recycle")), 4)
    p.bind(EngineInfo(vocab_size=1000))
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    calls = []
    real = p.sources["recycle"].candidates

    def timed(rows, step=None):  # recycle's own work takes 1 ms; an engine step 50 ms
        calls.append(True)
        clock[0] += 0.001
        return real(rows)

    monkeypatch.setattr(p.sources["recycle"], "candidates", timed)
    tokens = [1, 2, 3]
    for i in range(tuning.MIN_EVIDENCE + 8):  # fresh tokens: copy finds nothing, recycle has learned nothing
        tokens.append(100 + i)
        clock[0] += 0.05
        p.propose([row(0, tokens)])
    assert p.pricing.paused() == ["recycle"]
    calls.clear()
    for i in range(tuning.PROBE_EVERY):
        tokens.append(200 + i)
        clock[0] += 0.05
        p.propose([row(0, tokens)])
    assert len(calls) == 1  # paused: one probe in PROBE_EVERY steps
    # Now recycle knows what follows every token (the target's top-1 is the next one) and copy does not.
    vocab = np.arange(1000, dtype=np.int32)
    top = np.stack([(vocab + 1) % 1000] + [vocab] * 7, axis=1).astype(np.int32)
    p.observe(ScoredPositions(vocab, top, np.tile(np.array([0.99] + [0.0] * 7, np.float32), (1000, 1))))
    tokens, new, resumed = [400], 1, False
    for _ in range(3 * tuning.PROBE_EVERY):
        clock[0] += 0.05
        draft = p.propose([row(1, tokens, num_new=new)])[0]
        new = len(draft) + 1  # the target agrees with recycle: every draft token is accepted
        tokens = tokens + [tokens[-1] + j + 1 for j in range(new)]
        resumed = resumed or p.pricing.paused() == []
    assert resumed


def test_pricing_does_not_flap_for_a_source_at_the_margin():
    pricing = SourcePricing(("a", "b"))
    pricing.step_seconds, pricing.produced = 0.05, 1.0  # one output token is worth 50 ms
    pricing._last_run = ("a", "b")
    for name in ("a", "b"):
        price = pricing.prices[name]
        price.steps, price.seconds, price.right = tuning.MIN_EVIDENCE, 0.001, 0.022  # worth 1.1 ms for 1 ms
    pricing.prices["b"].paused_at = 0
    pricing._judge()
    assert pricing.paused() == ["b"]  # paying, but not clearly: a paused source stays paused ...
    pricing.prices["b"].right = 0.03
    pricing._judge()
    assert pricing.paused() == []  # ... until its worth is well above its cost
    pricing.prices["b"].right = 0.019
    pricing._judge()
    assert pricing.paused() == ["b"]  # and a running one stops as soon as it does not pay


def test_a_source_is_charged_the_right_tokens_its_wrong_draft_displaced():
    produced = np.array([5, 6, 7, 8, 9])
    # The draft followed recycle (supported 3 tokens, wrong at the 2nd) where suffix's own chain had 4 right.
    lost = displaced(np.array([5, 1, 2, 3]), {"recycle": 3, "suffix": 1}, {"recycle": 1, "suffix": 4}, produced)
    assert lost == {"recycle": 3}
    # Within the draft's length only: a 2-token draft could have won at most 2 from suffix's chain.
    assert displaced(np.array([5, 1]), {"recycle": 2, "suffix": 1}, {"recycle": 1, "suffix": 4}, produced) == {"recycle": 1}
    # A right draft, or one that no other chain would have bettered, costs nobody anything.
    assert displaced(np.array([5, 6]), {"recycle": 2}, {"recycle": 2, "suffix": 1}, produced) == {}
    assert displaced(np.array([5, 1]), {"recycle": 2, "suffix": 2}, {"recycle": 1, "suffix": 1}, produced) == {}


def run_rival(monkeypatch, steps: int):
    """suffix is right 4 tokens deep on 7 steps in 8, with low confidence; a rival ("copy", 1 ms a step,
    too dear to be exempt as cheap) is right 4 deep on the 8th step, where suffix has nothing, and on the
    other 7 wins the fusion and is wrong at its 2nd token. Its own tokens (4 per 8 steps) are worth more than
    its cost; what it displaces is worth more: on each of the 7 steps suffix was right at the token the
    rival got wrong (the counterfactual sees only the tokens the target produced, so 1 token a step)."""
    import time

    p = HybridProposer(HybridOptions(sources=("suffix", "copy")), 4)
    p.bind(EngineInfo(vocab_size=1000))
    clock, step = [0.0], [0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    def truth(r):
        return [int(r.tokens[-1]) + j + 1 for j in range(4)]

    def rival(rows, _step=None):
        clock[0] += 0.001
        chain = (lambda r: truth(r)) if step[0] % 8 == 0 else (lambda r: truth(r)[:1] + [998, 997, 996])
        return [Candidates("copy", np.array([chain(r)]), np.ones(1)) for r in rows]

    def suffix(rows, _step=None):
        if step[0] % 8 == 0:
            return [None for _ in rows]
        return [Candidates("suffix", np.array([truth(r)]), np.ones(1), token_probs=np.full((1, 4), 0.3)) for r in rows]

    monkeypatch.setattr(p.sources["copy"], "candidates", rival)
    monkeypatch.setattr(p.sources["suffix"], "candidates", suffix)
    tokens, new = [1, 2, 3], 3
    for step[0] in range(steps):
        clock[0] += 0.05
        draft = p.propose([row(0, tokens, num_new=new)])[0]
        accepted = 0
        while accepted < len(draft) and draft[accepted] == tokens[-1] + accepted + 1:
            accepted += 1
        new = accepted + 1
        tokens = tokens + [tokens[-1] + j + 1 for j in range(new)]
    return p


def test_hybrid_pauses_a_source_whose_wrong_chains_displace_more_than_its_own_tokens_add(monkeypatch):
    assert run_rival(monkeypatch, 4 * tuning.MIN_EVIDENCE).pricing.paused() == ["copy"]
    # Without charging what it displaces, the same rival pays for itself and keeps running.
    monkeypatch.setattr(hybrid_module, "displaced", lambda *args: {})
    assert run_rival(monkeypatch, 4 * tuning.MIN_EVIDENCE).pricing.paused() == []


def test_recycle_is_charged_the_top_k_captured_for_it():
    p = HybridProposer(HybridOptions(sources=("suffix", "recycle")), 4)
    p.bind(EngineInfo(vocab_size=1000))
    p.propose([row(0, [1, 2, 3])], StepContext(capture_seconds=0.004))
    assert p.pricing.prices["recycle"].seconds >= 0.004
    assert p.pricing.prices["suffix"].seconds < 0.004


def test_salted_traffic_neither_runs_recycle_nor_captures_the_top_k_for_it():
    """recycle serves requests without a cache_salt only: in a step of salted rows it would cost its time and the
    top-k capture for nothing, which made the default look costly next to a short step (SmolLM2 in bfloat16)
    and step aside at a cold start. A step with a shared-scope row runs it again."""
    p = HybridProposer(HybridOptions(sources=("suffix", "recycle")), 4)
    p.bind(EngineInfo(vocab_size=1000))
    salted = Row(0, np.asarray([1, 2, 3], dtype=np.int32), 1, "tenant-a")
    seconds = p.draft([salted], StepContext(capture_seconds=0.004)).source_seconds
    assert "recycle" not in seconds and "suffix" in seconds
    assert p.pricing.prices["recycle"].seconds == 0.0
    assert not p.wants_target_topk()
    seconds = p.draft([salted, row(1, [1, 2, 3])], StepContext()).source_seconds
    assert "recycle" in seconds and p.wants_target_topk()


def test_a_start_up_spike_in_a_sources_cost_gives_way_to_its_probes():
    """A source whose first call took 150 ms (a search kernel loading) and every later one 0.3 ms, and whose own
    tokens are worth several ms a step, is paused after the spike and resumed by its probes within a few
    hundred steps: a paused source's averages age by engine steps. Aged only by the steps it ran, the spike
    was still priced at 48 ms after 3,000 steps and the source never ran again."""
    pricing = SourcePricing(("a", "b"))
    runs_b, paused_seen, resumed_at = 0, False, None
    for step in range(1000):
        pricing.observe_step(0.05)
        if pricing._last_run:
            right = {"a": 1}
            if "b" in pricing._last_run:
                right["b"] = 1 if runs_b % 4 == 0 else 0  # one token of its own every 4th run: 6 ms a step
            pricing.observe_tokens(right, 2)
        run = tuple(n for n in ("a", "b") if pricing.runs(n))
        runs_b += "b" in run
        for name in run:
            pricing.observe_cost(name, 0.15 if name == "b" and runs_b == 1 else 0.0003)
        pricing.step_done(run)
        paused_seen = paused_seen or pricing.paused() == ["b"]
        if paused_seen and resumed_at is None and pricing.paused() == []:
            resumed_at = step
    assert paused_seen and resumed_at is not None and resumed_at < 500
    assert pricing.paused() == [] and pricing.prices["b"].seconds < 0.001


def test_pricing_never_pauses_a_source_cheaper_than_one_percent_of_a_step():
    """A source at 0.1 ms a step (vLLM-suffix-like, against a 40 ms step) whose worth is below zero (its wrong
    chains displace another source's right ones) keeps running; the same source at 1 ms a step is paused.
    A cheap source paused before its cost fell resumes at its next probe."""
    def run(cost_b, steps=tuning.MIN_EVIDENCE + 1, pricing=None):
        pricing = pricing or SourcePricing(("a", "b"))
        for _ in range(steps):
            pricing.observe_step(0.04)
            pricing.observe_tokens({"a": 1, "b": -1}, 2)
            for name in ("a", "b"):
                if pricing.runs(name):
                    pricing.observe_cost(name, cost_b if name == "b" else 0.002)
            pricing.step_done(tuple(n for n in ("a", "b") if pricing.runs(n)))
        return pricing

    assert run(0.0001).paused() == []
    dear = run(0.001)
    assert dear.paused() == ["b"]
    assert run(0.0001, 4 * tuning.PROBE_EVERY, dear).paused() == []
