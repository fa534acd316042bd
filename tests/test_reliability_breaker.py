"""The adapter's circuit breaker: a plugin that keeps failing or overruns its step budget is switched off and retried."""
from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from freespec.proposers.copy import CopyProposer
from freespec.vllm_plugins.adapter import CircuitBreaker, FreespecProposer
from freespec.vllm_plugins.frontend import FreespecConfigError, translate

from tests.adapter_helpers import adapter_for, fake_vllm_config


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class AlwaysFails(CopyProposer):
    """Raises on every step (a plugin with a bug that every request hits)."""

    calls = 0

    def draft(self, rows, step):
        type(self).calls += 1
        raise RuntimeError("injected fault")


class Slow(CopyProposer):
    """Sleeps past the step budget on every step while ``slow`` is set."""

    calls = 0
    slow = True

    def draft(self, rows, step):
        type(self).calls += 1
        if type(self).slow:
            time.sleep(0.25)
        return super().draft(rows, step)


class Forgets(CopyProposer):
    """Records the keys it is told to release; overruns a 20 ms budget if ``slow``, raises if ``fail``."""

    released: list = []
    slow = fail = False

    def draft(self, rows, step):
        if type(self).fail:
            raise RuntimeError("injected fault")
        if type(self).slow:
            time.sleep(0.05)
        return super().draft(rows, step)

    def release(self, key):
        type(self).released.append(key)
        super().release(key)


class SlowByDesign(CopyProposer):
    """Claims its options make a step take up to 5 s (as pearl does with a large ``sync_feed_tokens``)."""

    def step_time_needed(self):
        return 5.0, "a test plugin's catch-up"


def make_adapter(plugin: str, **keys) -> FreespecProposer:
    return adapter_for({"plugin": plugin, "num_speculative_tokens": 4, "policy": "fixed", **keys})


def stepper(adapter):
    tokens = np.tile(np.arange(10, dtype=np.int32), (1, 50))
    length = np.array([40], dtype=np.int32)

    def step():
        length[0] += 1
        return adapter.propose([[int(tokens[0, length[0] - 1])]], length, tokens)

    return step


def test_a_plugin_that_raises_every_step_is_switched_off_and_retried(caplog):
    AlwaysFails.calls = 0
    adapter = make_adapter("test_reliability_breaker:AlwaysFails")
    clock = adapter.breaker._clock = Clock()
    step = stepper(adapter)
    with caplog.at_level(logging.WARNING, logger="freespec"):
        for _ in range(10):
            assert step() == [[]]
    assert AlwaysFails.calls == 3  # was 10: every step paid for the failing plugin
    state = adapter.breaker_state()
    assert state["state"] == "open" and state["opens"] == 1 and state["skipped_steps"] == 7
    assert "3 bad steps in a row" in state["last_reason"] and "injected fault" in state["last_reason"]
    assert "circuit breaker open" in caplog.text
    clock.t += 1.0  # the first back-off
    step()
    assert AlwaysFails.calls == 4 and adapter.breaker_state()["state"] == "open"  # the trial failed
    assert adapter.breaker_state()["retry_in_s"] == 2.0  # doubled
    assert "half-open" in caplog.text and "trial step failed" in caplog.text
    assert adapter.stats.skipped_steps == 7  # the trial step ran the plugin


def test_a_slow_plugin_is_skipped_after_one_stall_and_comes_back_when_fast(caplog):
    Slow.calls, Slow.slow = 0, True
    adapter = make_adapter("test_reliability_breaker:Slow", step_budget_ms=20)
    clock = adapter.breaker._clock = Clock()
    step = stepper(adapter)
    step(), step()  # the grace steps (JIT, cold caches) are not timed
    assert adapter.breaker_state()["state"] == "closed"
    t0 = time.perf_counter()
    step()  # 250 ms > 10 x 20 ms: a stall
    assert adapter.breaker_state()["state"] == "open"
    t1 = time.perf_counter()
    for _ in range(20):
        step()
    assert time.perf_counter() - t1 < 0.2 < t1 - t0  # the next steps do not pay it again
    assert Slow.calls == 3 and adapter.stats.overruns == 3
    Slow.slow = False
    clock.t += 1.0
    with caplog.at_level(logging.WARNING, logger="freespec"):
        step()
    assert adapter.breaker_state()["state"] == "closed" and Slow.calls == 4
    assert "circuit breaker closed" in caplog.text


def test_breaker_counts_bad_steps_in_a_row_and_caps_the_backoff():
    clock = Clock()
    b = CircuitBreaker(0.1, "p", clock=clock)
    for _ in range(CircuitBreaker.GRACE_STEPS):
        b.record(None, 5.0)  # not timed
    assert b.state == "closed"
    assert not b.record("boom", 0.0) and not b.record("boom", 0.0)
    assert not b.record(None, 0.0)  # a good step resets the run
    assert not b.record(None, 0.2) and not b.record("boom", 0.0)  # overrun counts as bad
    assert b.record(None, 0.15) and b.state == "open"  # third bad in a row
    backoffs = []
    for _ in range(12):
        assert not b.allow()
        backoffs.append(b.retry_at - clock.t)
        clock.t = b.retry_at
        assert b.allow() and b.state == "half_open"
        assert b.record("still broken", 0.0)
    assert backoffs[:4] == [1.0, 2.0, 4.0, 8.0] and max(backoffs) == 300.0  # exponential, capped
    clock.t = b.retry_at
    assert b.allow() and not b.record(None, 0.0) and b.state == "closed"
    assert b.backoff_s == 300.0  # not yet proven healthy
    clock.t += CircuitBreaker.HEALTHY_S
    b.record(None, 0.0)
    assert b.backoff_s == 1.0  # healthy for a while: back to the first back-off


def test_step_budget_is_an_adapter_key_with_bounds_named_in_the_error():
    _, extra = translate({"plugin": "copy", "num_speculative_tokens": 4}, None)
    assert extra["freespec"]["step_budget_ms"] is None and "step_budget_ms" not in extra["freespec"]["options"]
    assert adapter_for({"plugin": "copy", "num_speculative_tokens": 4}).breaker.budget_s == 1.0  # the default
    _, extra = translate({"plugin": "copy", "num_speculative_tokens": 4, "step_budget_ms": 250}, None)
    assert extra["freespec"]["step_budget_ms"] == 250.0
    for bad in (0, -5, 1e9, "fast", True, None if False else [1]):
        with pytest.raises(FreespecConfigError, match=r"'step_budget_ms' must be a number in \[1, 60000\]"):
            translate({"plugin": "copy", "num_speculative_tokens": 4, "step_budget_ms": bad}, None)
    # The stock vLLM spelling is checked by the adapter itself.
    cfg = fake_vllm_config({"freespec": {"plugin": "copy", "options": {}, "step_budget_ms": 0}})
    with pytest.raises(FreespecConfigError, match="step_budget_ms"):
        FreespecProposer(cfg)


@pytest.mark.parametrize("fault", ["slow", "fail"])
def test_a_slow_plugin_keeps_its_requests_when_the_breaker_opens_and_a_failing_one_forgets_them(fault):
    Forgets.released, Forgets.slow, Forgets.fail = [], fault == "slow", fault == "fail"
    adapter = make_adapter("test_reliability_breaker:Forgets", step_budget_ms=20)
    adapter.breaker._clock = Clock()
    step = stepper(adapter)
    for _ in range(CircuitBreaker.GRACE_STEPS + CircuitBreaker.TRIP_AFTER):
        step()
    assert adapter.breaker_state()["state"] == "open"
    # Slow: the live request's state stays, so the trial step catches up on the steps it missed. Forgetting it
    # made pearl's trial step re-prefill every live context, overrun the budget and open the breaker again.
    assert Forgets.released == ([] if fault == "slow" else [0])


def test_the_budget_is_raised_to_what_a_plugins_own_options_need_unless_the_operator_set_it(caplog):
    with caplog.at_level(logging.INFO, logger="freespec"):
        adapter = make_adapter("test_reliability_breaker:SlowByDesign")
    assert adapter.breaker.budget_s == 5.0  # not the default 1 s: its slow steps are by design
    assert "step budget 5000 ms (not 'step_budget_ms' 1000): a test plugin's catch-up" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="freespec"):
        adapter = make_adapter("test_reliability_breaker:SlowByDesign", step_budget_ms=200)
    assert adapter.breaker.budget_s == 0.2  # the operator's value stands, with a warning naming the field
    assert "'step_budget_ms' 200 is below the 5000 ms its options need" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="freespec"):
        adapter = make_adapter("test_reliability_breaker:SlowByDesign", step_budget_ms=8000)
    assert adapter.breaker.budget_s == 8.0 and "step budget" not in caplog.text  # above the need: as given
