"""The adapter feeds the goodput policy and hands its bar to the proposer."""
from types import SimpleNamespace

import numpy as np
import pytest

from freespec.proposers.base import Draft
from freespec.scorers.policy import cut
from freespec.vllm_plugins import adapter as adapter_module
from freespec.vllm_plugins.adapter import FreespecProposer, step_tokens
from freespec.vllm_plugins.frontend import translate


def seq(n):
    return np.arange(n, dtype=np.int32)


def test_step_tokens_counts_decode_steps_and_skips_prefills():
    views = [(seq(10), 3), (seq(5), 1)]
    assert step_tokens(views, [[1, 2, 3], []]) == (4 + 1, 4)
    assert step_tokens(views, [[1, 2, 3], None]) is None  # a row seen for the first time: it prefilled
    assert step_tokens([(seq(10), 0)], [[]]) is None  # a partial prefill chunk


def make_adapter(policy: str) -> FreespecProposer:
    _, extra = translate({"plugin": "copy", "num_speculative_tokens": 4, "policy": policy, "step_aside": False}, None)
    cfg = SimpleNamespace(
        additional_config=extra,
        speculative_config=SimpleNamespace(num_speculative_tokens=4),
        model_config=SimpleNamespace(get_vocab_size=lambda: 1000, max_model_len=4096, model="m", tokenizer=None),
    )
    return FreespecProposer(cfg)


def drive(adapter, monkeypatch, steps=200, plugin_s_per_token=0.0):
    """Decode steps whose time grows by 2 ms per scored token over a 20 ms base; the plugin itself takes
    ``plugin_s_per_token`` for each token it drafts (a draft model's chain)."""
    clock = {"t": 0.0}
    monkeypatch.setattr(adapter_module.time, "perf_counter", lambda: clock["t"])
    if plugin_s_per_token:
        own = adapter.proposer.draft

        def timed(rows, step):  # a plugin whose time grows with the tokens it drafts (a draft model's chain)
            drafts = own(rows, step)
            bar = step.bar(adapter.proposer.fixed_bar())
            clock["t"] += plugin_s_per_token * sum(len(cut(d, bar).tokens) for d in drafts)
            return drafts

        monkeypatch.setattr(adapter.proposer, "draft", timed)
    # Random text over a tiny alphabet: copy finds matches of varying promise, so draft lengths vary.
    tokens = np.random.default_rng(0).integers(0, 6, size=(1, 2000)).astype(np.int32)
    length = np.array([100], dtype=np.int32)
    drafts = adapter.propose([[int(tokens[0, 99])]], length, tokens)
    for _ in range(steps):
        clock["t"] += 0.020 + 0.002 * (1 + len(drafts[0]))
        accepted = min(len(drafts[0]), 1)
        length[0] += accepted + 1
        drafts = adapter.propose([tokens[0, length[0] - accepted - 1 : length[0]].tolist()], length, tokens)
    return adapter.token_cost


def test_goodput_policy_sets_the_bar_from_measured_step_times(monkeypatch):
    cost = drive(make_adapter("goodput"), monkeypatch)
    # plain decoding: 1 token per (20 + 2) ms, each draft token costs 2 ms -> the bar is at least 2/22
    assert cost is not None and 0.09 <= cost <= 0.5


def test_a_plugin_that_prices_its_own_time_leaves_it_out_of_the_step_time_fit(monkeypatch):
    """hybrid's source pricing weighs each source's time; the policy must price verification only, or a
    slow source (a draft model's chain) raises the bar for every source's tokens (the Qwen RASD run:
    0.84 against retrieval alone's 0.055)."""
    plain = drive(make_adapter("goodput"), monkeypatch)
    counted = drive(make_adapter("goodput"), monkeypatch, plugin_s_per_token=0.030)
    assert counted > 2 * plain  # the plugin's 30 ms a token counted as verification cost
    adapter = make_adapter("goodput")
    adapter.proposer.prices_own_time = True
    assert drive(adapter, monkeypatch, plugin_s_per_token=0.030) == pytest.approx(plain)


def test_hybrid_with_source_pricing_prices_its_own_time():
    from freespec.proposers.hybrid import HybridOptions, HybridProposer

    assert HybridProposer(HybridOptions(sources=("suffix", "copy")), 4).prices_own_time
    assert not HybridProposer(HybridOptions(sources=("suffix", "copy"), price_sources=False), 4).prices_own_time
    assert not make_adapter("goodput").proposer.prices_own_time  # copy: its time stays in the step


def test_fixed_policy_leaves_the_plugins_own_threshold(monkeypatch):
    assert drive(make_adapter("fixed"), monkeypatch) is None


def test_goodput_is_the_default_also_for_the_stock_vllm_spelling():
    # --additional-config '{"freespec": {"plugin": "copy", "options": {}}}': no "policy" key at all.
    cfg = SimpleNamespace(
        additional_config={"freespec": {"plugin": "copy", "options": {}}},
        speculative_config=SimpleNamespace(num_speculative_tokens=4),
        model_config=SimpleNamespace(get_vocab_size=lambda: 1000, max_model_len=4096, model="m", tokenizer=None),
    )
    assert FreespecProposer(cfg).control.policy is not None
    assert make_adapter("fixed").control.policy is None


def test_the_adapter_pauses_topk_capture_while_the_proposer_will_not_use_it(monkeypatch):
    adapter = make_adapter("goodput")
    adapter.target_topk = adapter_module.TargetTopK(8)  # as for a plugin with recycling
    wants = {"now": False}
    monkeypatch.setattr(adapter.proposer, "wants_target_topk", lambda: wants["now"])
    tokens = np.zeros((1, 200), dtype=np.int32)
    adapter.propose([[0]], np.array([100], dtype=np.int32), tokens)
    assert adapter.target_topk.active is False
    wants["now"] = True
    adapter.propose([[0]], np.array([101], dtype=np.int32), tokens)
    assert adapter.target_topk.active is True


def test_the_adapter_tells_the_proposer_how_long_each_step_s_top_k_capture_took(monkeypatch):
    adapter = make_adapter("goodput")
    adapter.target_topk = adapter_module.TargetTopK(8)
    seen = []
    own = adapter.proposer.draft
    monkeypatch.setattr(adapter.proposer, "draft", lambda rows, step: seen.append(step.capture_seconds) or own(rows, step))
    tokens = np.zeros((1, 200), dtype=np.int32)
    adapter.target_topk._unclaimed_seconds = 0.003  # the capture during the first step's forward
    adapter.propose([[0]], np.array([100], dtype=np.int32), tokens)
    adapter.propose([[0]], np.array([101], dtype=np.int32), tokens)  # no capture in between
    adapter.target_topk._unclaimed_seconds = 0.002
    adapter.propose([[0]], np.array([102], dtype=np.int32), tokens)
    assert seen == pytest.approx([0.003, 0.0, 0.002])


def drive_shaped(adapter, monkeypatch, steps=300, shape=None):
    """Decode steps timed with a shape like the one measured on the CPU here (results/step-shape): 1 scored
    token slower than 3 to 5; returns the last drafts handed to vLLM."""
    clock = {"t": 0.0}
    monkeypatch.setattr(adapter_module.time, "perf_counter", lambda: clock["t"])
    shape = shape or {1: 0.051, 2: 0.055, 3: 0.047, 4: 0.046, 5: 0.044}
    tokens = np.random.default_rng(0).integers(0, 50, size=(1, 2000)).astype(np.int32)
    length = np.array([100], dtype=np.int32)
    drafts = adapter.propose([[int(tokens[0, 99])]], length, tokens)
    for _ in range(steps):
        clock["t"] += shape.get(1 + len(drafts[0]), 0.060)
        accepted = min(len(drafts[0]), 1)
        length[0] += accepted + 1
        drafts = adapter.propose([tokens[0, length[0] - accepted - 1 : length[0]].tolist()], length, tokens)
    return drafts, tokens[0, : length[0]]


def test_drafts_are_padded_to_the_fastest_measured_step_size(monkeypatch):
    adapter = make_adapter("goodput")
    drafts, context = drive_shaped(adapter, monkeypatch)
    assert len(drafts[0]) == 4  # 1 + 4 scored tokens: the fastest size
    assert adapter.stats.padded_tokens > 200 and adapter.stats.padding_accepted >= 0
    off = make_adapter("goodput")
    off.control.pad = False
    drafts, _ = drive_shaped(off, monkeypatch)
    assert off.stats.padded_tokens == 0 and len(drafts[0]) < 4


def test_a_draft_s_unlikely_last_tokens_are_dropped_where_a_smaller_step_pays_better(monkeypatch):
    """A plugin that always drafts 4 tokens, each half as likely as the one before, on a CPU where a step
    scoring 5 tokens is slow: 3 draft tokens a step (1.875 expected tokens in 46 ms against 1.94 in 60)."""
    shape = {1: 0.051, 2: 0.055, 3: 0.047, 4: 0.046, 5: 0.060}
    for pad, length in (("auto", 3), ("longer", 4)):
        adapter = make_adapter("goodput")
        adapter.control.trim = pad == "auto"
        monkeypatch.setattr(adapter.control.policy, "token_cost", lambda rows=None: 0.0)  # no goodput cut: sizing alone
        monkeypatch.setattr(adapter.proposer, "draft",
                            lambda rows, step: [Draft([7, 7, 7, 7], [0.5, 0.25, 0.125, 0.0625]) for _ in rows])
        drafts, _ = drive_shaped(adapter, monkeypatch, steps=800, shape=shape)
        assert len(drafts[0]) == length, pad
        assert (adapter.stats.trimmed_tokens > 150) == (pad == "auto") and adapter.stats.padded_tokens == 0
        if pad == "auto":  # the chances of the tokens handed to vLLM, summed
            assert 0.875 * 700 < adapter.stats.expected_accepted < 1.875 * 800


def test_drafts_are_never_cut_without_the_plugin_s_chances(monkeypatch):
    shape = {1: 0.051, 2: 0.055, 3: 0.047, 4: 0.046, 5: 0.060}
    adapter = make_adapter("goodput")
    monkeypatch.setattr(adapter.control.policy, "token_cost", lambda rows=None: 0.0)  # no goodput cut: sizing alone
    for chances in (None, [0.5, 0.25]):  # none, too few
        monkeypatch.setattr(adapter.proposer, "draft", lambda rows, step: [Draft([7, 7, 7, 7], chances) for _ in rows])
        drafts, _ = drive_shaped(adapter, monkeypatch, steps=600, shape=shape)
        assert len(drafts[0]) == 4 and adapter.stats.trimmed_tokens == 0 and adapter.stats.errors == 0


def test_pad_is_an_adapter_key_checked_at_start():
    _, extra = translate({"plugin": "copy", "num_speculative_tokens": 4, "pad": "off"}, None)
    assert next(iter(v for v in extra.values()))["pad"] == "off"
    with pytest.raises(Exception, match="'pad' must be one of"):
        translate({"plugin": "copy", "num_speculative_tokens": 4, "pad": "yes"}, None)
    _, extra = translate({"plugin": "copy", "num_speculative_tokens": 4, "pad": "longer"}, None)
    assert next(iter(v for v in extra.values()))["pad"] == "longer"
    assert not make_adapter("fixed").control.pad  # padding needs the goodput policy's step times


def test_padding_copies_what_followed_the_last_token_and_repeats_it_where_that_runs_out():
    from freespec.scorers.padding import context_padding

    tokens = np.array([5, 6, 7, 8, 5, 9, 3], dtype=np.int32)
    assert context_padding(tokens, [5], 3) == [9, 3, 5]  # after the latest 5: 9, 3, then 5 repeated
    assert context_padding(tokens, [], 2) == [3, 3]  # the last token, 3, never occurred before: repeated
    assert context_padding(np.array([4, 1, 2, 4], dtype=np.int32), [], 2) == [1, 2]
    assert context_padding(tokens, [5], 0) == []


def test_accepted_tokens_of_padding_are_counted_apart_from_the_source_that_drafted():
    from freespec.vllm_plugins.adapter import PADDING, accepted_by_source

    views = [(seq(20), 6), (seq(20), 2), (seq(20), 4)]  # 5, 1 and 3 draft tokens accepted
    drafts = [[1] * 6, [1] * 4, [1] * 3]
    by = accepted_by_source(views, drafts, ["suffix", None, "suffix"], "hybrid", [2, 0, 3])
    # row 1: 4 own tokens, 1 of its 2 padding accepted; row 2: 1 own; row 3: all 3 were padding
    assert by == {"suffix": 4, "hybrid": 1, PADDING: 4}


PADDING_NAME = adapter_module.PADDING


def test_padding_is_its_own_source_in_the_metrics(monkeypatch):
    adapter = make_adapter("goodput")
    counted = []
    monkeypatch.setattr(adapter.metrics, "step", lambda *a: counted.append(a))
    drive_shaped(adapter, monkeypatch)
    drafted = sum(a[4].get(PADDING_NAME, 0) for a in counted if a[4])
    accepted = sum(a[5].get(PADDING_NAME, 0) for a in counted if a[5])
    assert drafted == adapter.stats.padded_tokens > 0 and accepted == adapter.stats.padding_accepted
    assert all(a[4].get("copy", 0) + a[4].get(PADDING_NAME, 0) == a[0] for a in counted if a[4])


def test_a_failing_controller_drafts_nothing_for_that_step_and_never_stops_the_engine(monkeypatch):
    adapter = make_adapter("goodput")

    def broken(*_args, **_kwargs):
        raise RuntimeError("controller bug")

    monkeypatch.setattr(adapter.control, "step", broken)
    tokens = np.tile(np.arange(20, dtype=np.int32), 10)[None, :]
    for n in (100, 101, 102):
        drafts = adapter.propose([[int(tokens[0, n - 1])]], np.array([n], dtype=np.int32), tokens)
        assert drafts == [[]]
    assert adapter.stats.errors == 3
