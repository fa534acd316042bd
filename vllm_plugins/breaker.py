"""The circuit breaker: a plugin whose steps keep failing or overrunning is switched off for a while.

A step is synchronous in vLLM's worker, so nothing a plugin does may stall the server: the adapter
(``adapter.FreespecProposer``) times every step and tells the breaker; while it is open the plugin is not
called and every row drafts nothing, so vLLM decodes as without speculation.
"""
from __future__ import annotations

import logging
import time

logger = logging.getLogger("freespec")


class CircuitBreaker:
    """Switch a plugin off while its steps keep failing or overrunning the budget, and try it again later.

    Closed (the plugin runs): a *bad* step raised or took longer than ``budget_s``. ``TRIP_AFTER`` bad
    steps in a row, or one step over ``STALL_FACTOR`` x the budget (a stall: the next steps must not
    pay it again), open the breaker. The first ``GRACE_STEPS`` steps are not timed (JIT compilation, a
    cold page cache). Open: every step drafts nothing and the plugin is not called, for the back-off
    period. Then half-open: one trial step; if it is good the breaker closes, else it opens again with
    twice the back-off (from ``BACKOFF_S[0]`` up to ``BACKOFF_S[1]``). The back-off returns to its start
    once the plugin has stayed closed for ``HEALTHY_S``. Every transition is logged as a warning.

    A step is synchronous in vLLM's worker, so a step that overruns has already cost its time; the breaker
    makes sure the following steps do not.
    """

    TRIP_AFTER = 3
    STALL_FACTOR = 10.0
    GRACE_STEPS = 2
    BACKOFF_S = (1.0, 300.0)
    HEALTHY_S = 60.0

    def __init__(self, budget_s: float, name: str, clock=time.monotonic) -> None:
        self.budget_s = budget_s
        self.name = name
        self._clock = clock
        self.state = "closed"
        self.steps = 0
        self.bad_in_a_row = 0
        self.opens = 0
        self.skipped_steps = 0
        self.backoff_s = self.BACKOFF_S[0]  # the next open lasts this long
        self.retry_at = 0.0
        self.closed_since = clock()
        self.last_reason = ""
        self.last_kind = ""  # why it last opened, one of metrics.OFF_REASONS

    def allow(self) -> bool:
        """Whether the plugin runs this step (an open breaker whose back-off is over lets one trial through)."""
        if self.state != "open":
            return True
        if self._clock() < self.retry_at:
            self.skipped_steps += 1
            return False
        self.state = "half_open"
        logger.warning("freespec: plugin %r circuit breaker half-open: trying one step", self.name)
        return True

    def record(self, failure: str | None, seconds: float) -> bool:
        """Account one step the plugin ran (``failure``: its error, or None); True if the breaker opened now."""
        self.steps += 1
        timed = self.steps > self.GRACE_STEPS
        over = timed and seconds > self.budget_s
        stalled = timed and seconds > self.STALL_FACTOR * self.budget_s
        bad = failure is not None or over
        reason = failure or (f"step took {1000 * seconds:.0f} ms, budget {1000 * self.budget_s:.0f} ms" if over else "")
        if self.state == "half_open":
            if bad:
                self._open(f"trial step failed ({reason})", "trial_failed")
                return True
            self.state, self.bad_in_a_row, self.closed_since = "closed", 0, self._clock()
            logger.warning("freespec: plugin %r circuit breaker closed: the trial step was good; drafting again",
                           self.name)
            return False
        if not bad:
            self.bad_in_a_row = 0
            if self.backoff_s > self.BACKOFF_S[0] and self._clock() - self.closed_since >= self.HEALTHY_S:
                self.backoff_s = self.BACKOFF_S[0]
            return False
        self.bad_in_a_row += 1
        if stalled:
            self._open(f"{reason}, over {self.STALL_FACTOR:g}x the budget", "stall")
            return True
        if self.bad_in_a_row >= self.TRIP_AFTER:
            kind = "error" if failure is not None else "over_budget"
            self._open(f"{self.bad_in_a_row} bad steps in a row, the last: {reason}", kind)
            return True
        return False

    def _open(self, reason: str, kind: str) -> None:
        self.state = "open"
        self.opens += 1
        self.last_reason, self.last_kind = reason, kind
        self.retry_at = self._clock() + self.backoff_s
        logger.warning("freespec: plugin %r circuit breaker open: %s; drafting nothing for %.0f s, then one trial "
                       "step (open %d times so far)", self.name, reason, self.backoff_s, self.opens)
        self.backoff_s = min(2 * self.backoff_s, self.BACKOFF_S[1])
        self.bad_in_a_row = 0

    def state_dict(self) -> dict:
        return {
            "state": self.state,
            "budget_ms": round(1000 * self.budget_s, 3),
            "bad_in_a_row": self.bad_in_a_row,
            "opens": self.opens,
            "skipped_steps": self.skipped_steps,
            "retry_in_s": round(max(0.0, self.retry_at - self._clock()), 3) if self.state == "open" else 0.0,
            "next_backoff_s": self.backoff_s,
            "last_reason": self.last_reason,
        }


def step_budget_s(proposer, plugin: str, budget_s: float, given: bool) -> float:
    """The breaker's step budget: ``step_budget_ms`` (``budget_s``), raised to what the plugin's own options make
    a step take (``Proposer.step_time_needed``) unless the operator set it (``given``), who is then warned once."""
    try:
        needed = proposer.step_time_needed()
    except Exception:
        needed = None
    if not needed or needed[0] <= budget_s:
        return budget_s
    seconds, why = needed
    if given:
        logger.warning(
            "freespec: plugin %r: speculative_config 'step_budget_ms' %g is below the %g ms its options "
            "need (%s): the circuit breaker will switch it off on those steps; raise step_budget_ms or "
            "leave it unset", plugin, budget_s * 1000, seconds * 1000, why)
        return budget_s
    logger.info("freespec: plugin %r: step budget %g ms (not 'step_budget_ms' %g): %s",
                plugin, seconds * 1000, budget_s * 1000, why)
    return float(seconds)
