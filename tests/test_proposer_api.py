"""The proposer API (freespec.proposers.base): the step contract, the policy's one cut, and which plugin names
and classes are refused at the config stage."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from freespec.proposers.base import API_VERSION, Draft, Drafts, Proposer, ProposerOptions, Row, StepContext
from freespec.proposers.copy import CopyProposer
from freespec.proposers.registry import UnknownPluginError, load_proposer_class
from freespec.scorers.policy import cut, paying_prefix
from freespec.vllm_plugins import metrics
from freespec.vllm_plugins.frontend import FreespecConfigError, check_additional_config, translate

from tests.adapter_helpers import adapter_for, fake_vllm_config

REPEATS = [5, 6, 7, 8, 9, 10, 11, 5, 6, 7]


class Fixed(Proposer):
    """Drafts the same four tokens with halving chances; records every step context it is given."""

    def __init__(self, options: ProposerOptions, k: int) -> None:
        super().__init__(options, k)
        self.steps: list[StepContext] = []

    def draft(self, rows, step):
        self.steps.append(step)
        return Drafts([Draft([1, 2, 3, 4], [0.5, 0.25, 0.125, 0.0625], "fixed-source") for _ in rows],
                      {"fixed-source": 0.001})


class Abstract(Proposer):
    pass


class OnlyPropose(Proposer):
    """Written against API 0, which went before any release: ``propose(rows)`` without ``draft``."""

    def propose(self, rows, step=None):
        return [[1] for _ in rows]


def step_through(adapter, tokens, steps=3):
    length = np.array([len(tokens)], dtype=np.int32)
    ids = np.zeros((1, 400), dtype=np.int32)
    ids[0, : len(tokens)] = tokens
    out = []
    for _ in range(steps):
        out.append(adapter.propose([[int(ids[0, length[0] - 1])]], length, ids))
        length[0] += 1
    return out


def test_the_api_has_a_version():
    assert API_VERSION.split(".")[0] == "1"


def test_the_policy_cuts_a_draft_where_its_chance_falls_below_the_bar_and_nowhere_else():
    d = Draft([1, 2, 3, 4], [0.9, 0.6, 0.3, 0.1], "s")
    assert cut(d, 0.3) == Draft([1, 2, 3], [0.9, 0.6, 0.3], "s")
    assert cut(d, None) is d and cut(Draft([1, 2]), 0.99).tokens == [1, 2]  # no bar, no chances: whole
    assert paying_prefix([0.9, 0.6], 0.95) == 0
    assert StepContext(token_cost=None).bar(0.2) == 0.2 and StepContext(token_cost=0.7).bar(0.2) == 0.7


def test_the_adapter_passes_the_step_in_the_call_and_sets_nothing_on_the_proposer():
    adapter = adapter_for({"plugin": "tests.test_proposer_api:Fixed", "num_speculative_tokens": 4,
                           "policy": "fixed"})
    adapter.metrics = metrics.PluginMetrics("test_proposer_api:Fixed")
    before = dict(vars(adapter.proposer))
    out = step_through(adapter, [9] * 50)
    assert all(isinstance(s, StepContext) and s.budget_s == adapter.breaker.budget_s
               for s in adapter.proposer.steps)
    assert set(vars(adapter.proposer)) == set(before) and "token_cost" not in vars(adapter.proposer)
    assert out[-1] == [[1, 2, 3, 4]]  # the fixed policy and no fixed bar: the draft whole
    assert adapter.stats.draft_tokens == 12


def test_the_goodput_price_cuts_what_the_proposer_returns(monkeypatch):
    adapter = adapter_for({"plugin": "tests.test_proposer_api:Fixed", "num_speculative_tokens": 4, "pad": "off"})
    monkeypatch.setattr(adapter.control.policy, "token_cost", lambda rows=None: 0.2)
    out = step_through(adapter, [9] * 50)
    assert out[-1] == [[1, 2]]  # 0.125 < 0.2
    assert adapter.proposer.steps[-1].token_cost == 0.2


def test_plugin_names_of_the_wrong_form_or_abstract_classes_are_refused_before_any_engine():
    for name in ("..x:y", ":", "a:b:c", "x y:Z"):
        with pytest.raises(UnknownPluginError, match="class path of the form"):
            load_proposer_class(name)
    with pytest.raises(UnknownPluginError, match="is abstract"):
        load_proposer_class("freespec.proposers.base:Proposer")
    with pytest.raises(UnknownPluginError, match="is abstract"):
        load_proposer_class("tests.test_proposer_api:Abstract")
    with pytest.raises(UnknownPluginError, match="not a freespec Proposer subclass"):
        load_proposer_class("os:path")
    with pytest.raises(UnknownPluginError, match="cannot be loaded"):
        load_proposer_class("tests.no_such_module:X")
    assert load_proposer_class("tests.test_proposer_api:Fixed").is_concrete()
    with pytest.raises(UnknownPluginError, match="is abstract"):  # API 0's propose(rows) alone no longer drafts
        load_proposer_class("tests.test_proposer_api:OnlyPropose")


@pytest.mark.parametrize("extra, field", [
    ({"policy": "fast"}, "'policy' must be one of"),
    ({"pad": "bogus"}, "'pad' must be one of"),
    ({"step_budget_ms": 0}, "'step_budget_ms' must be a number"),
    ({"colour": 1}, "unknown key"),
    ({"options": {"min_match": "x"}}, "min_match"),
])
def test_the_plain_vllm_spelling_gets_the_front_ends_checks_and_messages(extra, field):
    cfg = {"plugin": "copy", "options": {}, **extra}
    with pytest.raises(FreespecConfigError, match=field):
        check_additional_config(cfg, 4)
    spelled = {"plugin": "copy", "num_speculative_tokens": 4,
               **{k: v for k, v in extra.items() if k not in ("options", "colour")}}
    if "policy" in extra or "pad" in extra or "step_budget_ms" in extra:  # the same message both ways
        with pytest.raises(FreespecConfigError) as front:
            translate(spelled, None)
        with pytest.raises(FreespecConfigError) as plain:
            check_additional_config(cfg, 4)
        assert str(front.value) == str(plain.value)


def test_the_plain_vllm_spelling_refuses_a_k_the_front_end_refuses():
    cfg = SimpleNamespace(**vars(fake_vllm_config({"freespec": {"plugin": "copy", "options": {}}}, k=8000)))
    with pytest.raises(FreespecConfigError, match="num_speculative_tokens"):
        from freespec.vllm_plugins.adapter import FreespecProposer

        FreespecProposer(cfg)


def test_the_step_context_is_read_only_and_a_proposers_timings_come_back_in_its_result():
    with pytest.raises(dataclasses.FrozenInstanceError):
        StepContext().token_cost = 0.5  # a proposer cannot write into its input
    assert Drafts([Draft([1])], {"a": 0.1}).source_seconds == {"a": 0.1} and Drafts().source_seconds == {}


def test_each_step_is_one_record_read_by_the_next(monkeypatch):
    adapter = adapter_for({"plugin": "tests.test_proposer_api:Fixed", "num_speculative_tokens": 4,
                           "policy": "fixed"})
    adapter.metrics = metrics.PluginMetrics("test_proposer_api:Fixed")
    out = step_through(adapter, [9] * 50)
    record = adapter.last
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.tokens = []  # built once, never changed
    assert list(record.tokens) == out[-1] and record.drafted and record.source_seconds == {"fixed-source": 0.001}
    monkeypatch.setattr(adapter.breaker, "allow", lambda: False)
    step_through(adapter, [9] * 50, steps=1)
    assert adapter.last.started is None and not adapter.last.measured and adapter.last.given() == {}


def test_a_source_offers_its_whole_draft_with_its_chances_and_only_the_policy_cuts():
    p = CopyProposer(CopyProposer.Options(), 4)
    rows = [Row(0, np.asarray(REPEATS), 1)]
    found = p.candidates(rows, StepContext(token_cost=0.99))[0]  # a bar no token of it clears
    chances = CopyProposer(CopyProposer.Options(), 4).draft(rows, StepContext()).pop().chances
    assert found.chains[0].tolist() == [8, 9, 10, 11]
    assert np.allclose(np.cumprod(found.token_probs[0]), chances)  # each token's chance given those before it


def test_the_goodput_cut_is_decided_in_one_place():
    """Every caller asks ``scorers.policy.cut``; nothing else compares a draft's chances with the bar."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    callers = [str(f.relative_to(root)) for folder in ("proposers", "scorers", "vllm_plugins")
               for f in (root / folder).rglob("*.py")
               if "paying_prefix(" in f.read_text() and f.name != "policy.py"]
    assert callers == []
