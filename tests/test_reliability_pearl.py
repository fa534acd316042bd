"""PEARL's failure rules (issue 19): never off for good, one long step timeout at most, a timeout for threads too."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from freespec.proposers.pearl import remote as pearl_remote
from freespec.proposers.base import Row
from freespec.proposers.pearl.remote import DraftError, DraftTimeout, RemoteDraft


class FakeDraft(RemoteDraft):
    """RemoteDraft over an in-memory transport whose draft can be told to die or hang."""

    kind = "fake draft"

    def __init__(self, **kw) -> None:
        super().__init__({"model": "x"}, **kw)
        self.launches = 0
        self.running = False
        self.mode = "ok"  # "ok", "die", "hang"
        self.timeouts: list[float] = []
        self.messages: list[dict] = []

    def _launch(self):
        self.launches += 1
        self.running = True

    def _launched(self):
        return self.running

    def _poll_ready(self, timeout):
        return {"ok": True, "info": {"vocab_size": 10}}

    def _call(self, msg, payload, timeout, what):
        self.timeouts.append(timeout)
        self.messages.append(msg)
        if self.mode == "die":
            raise DraftError("pearl: the fake draft died")
        if self.mode == "hang":
            raise DraftTimeout(f"pearl: the fake draft did not answer {what} within {timeout:.0f} s")
        return {"ok": True, "chains": [[1] for _ in msg["keys"]]}

    def _tell(self, msg):
        pass

    def _kill(self):
        self.running = False
        self._ready = False


def rows():
    return [Row(0, np.arange(4, dtype=np.int32), 1)]


class Clock:
    def __init__(self, monkeypatch):
        self.t = 100.0
        monkeypatch.setattr(pearl_remote.time, "monotonic", lambda: self.t)


def test_after_the_restart_cap_pearl_backs_off_and_comes_back(monkeypatch):
    clock = Clock(monkeypatch)
    d = FakeDraft(step_timeout_s=30.0, max_restarts=3)
    d.start()
    d.mode = "die"
    for _ in range(8):
        d.step(rows())
    # 4 failures: 3 restarts, then a back-off instead of "off for good" (was: off until the process restarts)
    assert d.deaths == 4 and d.restarts == 3 and d.backoffs == 1 and not d._launched()
    d.mode = "ok"
    clock.t += pearl_remote.RESTART_BACKOFF_S[0]
    assert d.step(rows()) == [[]]  # relaunched now, without waiting for the model to load
    assert d.step(rows()) == [[1]] and d.restarts == 4
    d.mode = "die"
    d.step(rows())
    d.step(rows())
    assert d.backoffs == 2 and d._relaunch_at - clock.t == 2 * pearl_remote.RESTART_BACKOFF_S[0]  # doubled
    # A draft healthy for HEALTHY_S clears the count and the back-off.
    d.mode = "ok"
    clock.t = d._relaunch_at
    d.step(rows())
    d.step(rows())
    clock.t += pearl_remote.HEALTHY_S
    d.step(rows())
    assert d.failures_in_a_row == 0 and d._backoff_s == pearl_remote.RESTART_BACKOFF_S[0]


def test_one_step_waits_the_full_timeout_at_most_once(monkeypatch):
    clock = Clock(monkeypatch)
    d = FakeDraft(step_timeout_s=30.0, max_restarts=100)
    d.start()
    d.mode = "hang"
    for _ in range(10):
        d.step(rows())  # each call relaunches and the next one steps again
    long_waits = [t for t in d.timeouts if t > pearl_remote.RETRY_TIMEOUT_S]
    assert long_waits == [30.0], d.timeouts  # was 30 s every time the restarted draft hung again
    d.mode = "ok"
    d.step(rows())
    clock.t += pearl_remote.HEALTHY_S
    d.step(rows())
    d.step(rows())
    assert d.timeouts[-1] == 30.0  # healthy again: the configured timeout


def test_after_a_timeout_the_restarted_draft_catches_up_in_the_background(monkeypatch):
    clock = Clock(monkeypatch)
    d = FakeDraft(step_timeout_s=30.0, max_restarts=3)
    d.start()
    d.step(rows())
    assert d.messages[-1]["sync_feed_tokens"] is None  # the option's limit
    d.mode = "hang"
    d.step(rows())  # timed out: killed and restarted; the new draft holds no request
    d.mode = "ok"
    assert d.step(rows()) == [[1]]
    # Re-reading every live context within RETRY_TIMEOUT_S cannot succeed (was: the step timed out, the
    # draft was restarted, and so on while those requests lived): rows far behind are caught up in the
    # background.
    assert d.timeouts[-1] == pearl_remote.RETRY_TIMEOUT_S
    assert d.messages[-1]["sync_feed_tokens"] == pearl_remote.RETRY_SYNC_FEED_TOKENS
    clock.t += pearl_remote.HEALTHY_S
    d.step(rows())
    d.step(rows())
    assert d.timeouts[-1] == 30.0 and d.messages[-1]["sync_feed_tokens"] is None  # healthy again


def test_step_timeout_is_bounded():
    from freespec.proposers.pearl.proposer import PearlOptions

    fields = PearlOptions.model_fields["step_timeout_s"]
    assert any(getattr(m, "le", None) == 120 for m in fields.metadata)
    assert "thread" in fields.description


class SlowDrafter:
    """A drafter whose step takes ``delay`` seconds."""

    def __init__(self):
        self.delay = 0.0
        self.calls = 0

    def step(self, rows, token_cost=None, sync_feed_tokens=None):
        self.calls += 1
        time.sleep(self.delay)
        return [[self.calls] for _ in rows]

    def extend(self, should_stop):
        return True

    def reset(self):
        pass

    def release(self, key):
        pass


def test_the_thread_placement_times_out_and_skips_until_the_late_step_is_done():
    pytest.importorskip("torch")
    from freespec.proposers.pearl.proposer import TimedDraftWorker

    drafter = SlowDrafter()
    w = TimedDraftWorker(drafter, step_timeout_s=0.3)
    try:
        assert w.step(rows()) == [[1]]
        drafter.delay = 1.0
        t0 = time.monotonic()
        assert w.step(rows()) == [[]]  # was: blocked until the draft answered, however long
        assert 0.3 <= time.monotonic() - t0 < 0.8 and w.timeouts == 1
        t0 = time.monotonic()
        assert w.step(rows()) == [[]] and time.monotonic() - t0 < 0.1  # the late step still runs: no wait
        assert w.skipped_steps == 1
        drafter.delay = 0.0
        time.sleep(1.0)  # the late step finishes
        assert w.step(rows()) == [[3]]  # its chains ([2]) were discarded
    finally:
        w.close()
    assert not any(t.name == "freespec-pearl-draft" and t.is_alive() for t in threading.enumerate())
