"""The V1 adapter's goodput policy and circuit breaker around a V2 speculator: the same ``scorers.controller``
and ``breaker`` code, fed from V2's steps (the width V2 verifies, filler included, and the time between steps)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from test_speculators import K, TURNS, run_lockstep, v2_parts

vllm = pytest.importorskip("vllm")
torch = pytest.importorskip("torch")


def speculator_with(options=None, requests=2, prompt=(5, 6, 7, 8, 5, 6, 7)):
    from freespec.vllm_plugins.v2.speculator import FreespecSpeculator

    config, states = v2_parts("freespec_copy", options)
    speculator = FreespecSpeculator(config, torch.device("cpu"), req_states=states)
    slots = np.asarray([states.add_request(f"r{i}", list(prompt)) for i in range(requests)], dtype=np.int32)
    for slot in slots:
        speculator.add_request(int(slot))
    return speculator, states, slots


def step(speculator, states, slots, new=1, width=None):
    """One decode step: ``new`` sampled tokens appended to each row (repeating the prompt), then propose."""
    for slot in slots if new else ():
        tokens = states.all_token_ids.gpu[int(slot), : int(states.total_len.gpu[int(slot)])].tolist()
        states.append(int(slot), tokens[4: 4 + new])
    batch = SimpleNamespace(num_reqs=len(slots), req_ids=[f"r{i}" for i in range(len(slots))],
                            idx_mapping=torch.from_numpy(slots), idx_mapping_np=slots)
    num_sampled = torch.full((len(slots),), new, dtype=torch.int32)
    drafts = speculator.propose(batch, None, None, None, None, num_sampled, torch.zeros_like(num_sampled),
                                states.last_sampled_tokens, None, None, None, num_speculative_tokens=width)
    return [drafts[i, : int(speculator.num_valid[i])].tolist() for i in range(len(slots))]


def test_the_speculator_drafts_what_its_proposer_drafts_at_the_policys_price_every_step(monkeypatch):
    """The default ``"policy": "goodput"``: each step the reference drafts at the price the speculator's controller
    set from V2's measured steps; the scripted run gets priced steps (explored or fitted), not only the fixed bar."""
    steps, drafted, prices = run_lockstep("copy", {"min_match": 3}, monkeypatch, turns=TURNS[:5])
    assert steps > 50 and drafted > 100
    assert any(p is not None for p in prices)


def test_the_policy_measures_each_step_at_the_width_v2_verifies(monkeypatch):
    speculator, states, slots = speculator_with()
    seen = []
    monkeypatch.setattr(speculator.control.policy, "observe_step",
                        lambda scored, produced, seconds, rows=1: seen.append((scored, produced, rows)))
    step(speculator, states, slots, new=0)  # prefill: not measured next step
    step(speculator, states, slots, new=1)
    step(speculator, states, slots, new=1, width=3)
    step(speculator, states, slots, new=2)
    # Each decoding row scored its last token and every slot V2 verified (filler included): K, then 3.
    assert seen == [(2 * (1 + K), 2, 2), (2 * (1 + 3), 4, 2)]


def test_drafts_are_cut_at_the_policys_price(monkeypatch):
    """The plugin's draft with its chances, cut where the chance falls below the step's price (policy.cut)."""
    from freespec.proposers.api import Draft

    speculator, states, slots = speculator_with(requests=1)
    step(speculator, states, slots)
    prices = []
    monkeypatch.setattr(speculator.proposer, "draft", lambda rows, s: prices.append(s.token_cost) or [
        Draft([11, 12, 13, 14], [0.9, 0.8, 0.5, 0.2])])
    for cost, kept in ((0.0, 4), (0.6, 2), (0.95, 0)):
        monkeypatch.setattr(speculator.control, "step", lambda *a, cost=cost: (True, cost))
        assert step(speculator, states, slots) == [[11, 12, 13, 14][:kept]]
        assert speculator.last.token_cost == cost
    assert prices == [0.0, 0.6, 0.95]  # the plugin is told the price too (StepContext.token_cost)


def test_a_plugin_that_steps_aside_is_not_asked(monkeypatch):
    speculator, states, slots = speculator_with()
    calls = []
    original = speculator.proposer.draft
    monkeypatch.setattr(speculator.proposer, "draft", lambda rows, s: calls.append(1) or original(rows, s))
    monkeypatch.setattr(speculator.control, "step", lambda *a: (False, None))
    assert step(speculator, states, slots) == [[], []] and not calls
    assert speculator.last.started is not None and not speculator.last.drafted  # measured as a plain step


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_failing_plugin_is_switched_off_then_tried_again(monkeypatch):
    from freespec.vllm_plugins.breaker import CircuitBreaker

    speculator, states, slots = speculator_with()
    clock = Clock()
    speculator.breaker = CircuitBreaker(speculator.breaker.budget_s, "copy", clock=clock)
    calls, fail = [], [True]
    original = speculator.proposer.draft

    def draft(rows, s):
        calls.append(1)
        if fail[0]:
            raise RuntimeError("boom")
        return original(rows, s)

    monkeypatch.setattr(speculator.proposer, "draft", draft)
    for _ in range(CircuitBreaker.TRIP_AFTER):
        assert step(speculator, states, slots) == [[], []]
    assert speculator.breaker_state()["state"] == "open" and len(calls) == CircuitBreaker.TRIP_AFTER
    for _ in range(3):  # open: the plugin is not called, every row drafts nothing
        assert step(speculator, states, slots) == [[], []]
    assert len(calls) == CircuitBreaker.TRIP_AFTER
    clock.now += CircuitBreaker.BACKOFF_S[0] + 0.1  # the back-off is over: one trial step
    fail[0] = False
    step(speculator, states, slots)
    assert len(calls) == CircuitBreaker.TRIP_AFTER + 1 and speculator.breaker_state()["state"] == "closed"


def test_a_slow_plugin_is_switched_off(monkeypatch):
    import time

    from freespec.vllm_plugins.breaker import CircuitBreaker

    speculator, states, slots = speculator_with({"step_budget_ms": 1})
    original = speculator.proposer.draft
    monkeypatch.setattr(speculator.proposer, "draft", lambda rows, s: time.sleep(0.005) or original(rows, s))
    for _ in range(CircuitBreaker.GRACE_STEPS + CircuitBreaker.TRIP_AFTER):
        step(speculator, states, slots)
    state = speculator.breaker_state()
    assert state["state"] == "open" and "budget" in state["last_reason"]
