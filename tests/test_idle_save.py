"""The adapter's idle saves (vllm_plugins.idle_save): a proposer's idle() runs when no step came for a while,
never during a step nor once the final save has begun, and a failing one never stops anything."""
from __future__ import annotations

import logging
import threading
import time

import pytest

from freespec.proposers.learned import exit_save
from freespec.vllm_plugins.idle_save import IdleSave

IDLE = 0.2


class Recording:
    def __init__(self, fail: bool = False, more: int = 0) -> None:
        self.calls: list[float] = []
        self.fail = fail
        self.more = more  # calls that say more work waits
        self.in_step = False
        self.overlapped = False

    def idle(self) -> bool:
        self.overlapped |= self.in_step
        self.calls.append(time.monotonic())
        if self.fail:
            raise OSError("no")
        self.more -= 1
        return self.more >= 0


def wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.fixture
def saves():
    made: list[IdleSave] = []

    def make(proposer, idle_s=IDLE):
        made.append(IdleSave(proposer, idle_s))
        return made[-1]

    yield make
    for s in made:
        s.stop()


def test_idle_is_called_after_a_quiet_spell_and_again_only_a_spell_later(saves):
    p = Recording()
    start = time.monotonic()
    saves(p)
    assert wait_for(lambda: len(p.calls) >= 2)
    assert p.calls[0] - start >= IDLE
    assert p.calls[1] - p.calls[0] >= IDLE


def test_more_work_is_called_for_at_once_and_a_step_may_come_in_between(saves):
    p = Recording(more=3)
    s = saves(p)
    assert wait_for(lambda: len(p.calls) >= 4)
    assert p.calls[3] - p.calls[0] < IDLE / 2  # the four calls back to back, not a quiet spell apart
    time.sleep(IDLE / 2)
    assert len(p.calls) == 4  # the fourth said no more: the next waits for a spell
    p.more = 1_000_000  # a proposer with endless work still lets a step in
    assert wait_for(lambda: len(p.calls) > 10)
    with s.step():
        taken = len(p.calls)
        time.sleep(0.05)
        assert len(p.calls) == taken


def test_steps_keep_it_from_running_and_it_never_runs_during_one(saves):
    p = Recording()
    s = saves(p)
    deadline = time.monotonic() + 4 * IDLE
    while time.monotonic() < deadline:  # steps every IDLE/4: never idle
        with s.step():
            p.in_step = True
            time.sleep(0.005)
            p.in_step = False
        time.sleep(IDLE / 4)
    assert p.calls == []
    with s.step():  # one long step (a big prefill): the thread finds the lock taken
        p.in_step = True
        time.sleep(3 * IDLE)
        p.in_step = False
    assert wait_for(lambda: p.calls)
    assert not p.overlapped


def test_a_step_waits_for_an_idle_call_in_progress(saves):
    entered, release = threading.Event(), threading.Event()

    class Slow:
        def idle(self):
            entered.set()
            release.wait(5)

    s = saves(Slow())
    assert entered.wait(5)
    got = []

    def step():
        with s.step():
            got.append("stepped")

    t = threading.Thread(target=step)
    t.start()
    time.sleep(0.1)
    assert got == []  # the step waits: the two never touch the proposer at once
    release.set()
    t.join(5)
    assert got


def test_no_idle_call_once_the_final_save_has_begun(saves, monkeypatch):
    monkeypatch.setattr(exit_save, "_exiting", True)
    p = Recording()
    s = saves(p)
    time.sleep(3 * IDLE)
    assert p.calls == [] and not s._thread.is_alive()


def test_the_final_save_waits_for_an_idle_call_in_progress(monkeypatch):
    monkeypatch.setattr(exit_save, "_exiting", False)
    order = []
    inside, leave = threading.Event(), threading.Event()

    def idle_work():
        with exit_save.between_saves() as open_:
            assert open_
            inside.set()
            leave.wait(5)
            order.append("idle")

    t = threading.Thread(target=idle_work)
    t.start()
    assert inside.wait(5)
    final = threading.Thread(target=exit_save._final(lambda: order.append("final")))
    final.start()
    time.sleep(0.1)
    assert order == []
    leave.set()
    t.join(5)
    final.join(5)
    assert order == ["idle", "final"]
    with exit_save.between_saves() as open_:
        assert not open_  # after the final save, no more work on the state


def test_a_failing_idle_is_logged_once_and_tried_again(saves, caplog):
    p = Recording(fail=True)
    with caplog.at_level(logging.ERROR, logger="freespec"):
        s = saves(p)
        assert wait_for(lambda: len(p.calls) >= 3)
    assert s.errors >= 3 and s._thread.is_alive()
    assert len([r for r in caplog.records if "idle save failed" in r.getMessage()]) == 1
