"""Never slower than no speculation: a plugin whose own time does not pay for itself steps aside.

The goodput policy (``policy.py``) prices verifying a draft token; it cannot see what drafting itself costs
the engine. A draft model on a CPU core that does not keep up with the target makes vLLM wait for its chain
every step, and then the speculation is slower than none however good its drafts are (docs/pearl.md measured
0.72x). ``StepAside`` measures, for a plugin whose own time is a real share of the step, what the engine
produces per second with the plugin drafting and with it stepped aside, at the same number of requests, and
keeps the faster:

- a plugin whose own time stays under ``COSTLY_SHARE`` of a step's wall time always drafts (the text sources
  take a millisecond or two; the policy keeps their drafts from costing throughput);
- otherwise each batch size is measured ``PHASE_STEPS`` steps drafting nothing (plain decoding) and
  ``PHASE_STEPS`` steps drafting, plain first: a drafting measurement that, after ``EARLY_STEPS`` measured steps,
  is more than ``WIDE_LOSS`` slower a token than plain decoding ends there (a draft that loses by that much
  does not need sixteen steps to show it, and each of them cost the user; the Qwen pair's first question at
  one request served 0.68x no speculation while it ran); from then on the faster mode runs, drafting on a
  tie within ``MARGIN``, and the decision is only made again when a recheck ends (the mode running drifts as
  contexts grow while the other's rate stands still: compared every step, a tie flipped every few steps);
- a batch size not yet measured, above one where drafting lost, steps aside from its first step and is
  measured at its first recheck (``_inherit``): a draft that loses at fewer requests loses at more, and
  measuring it drafting at each new batch size is where it cost the most; a first drafting measurement
  already under way when drafting loses at fewer requests stops and steps aside likewise;
- a plugin's share is its median over each drafting measurement (a recheck included) as well as its running
  average (started from the median of its first ``PHASE_STEPS`` drafting steps, not from a first call's
  one-time cost): a plugin that stops running its costly part while it sits out (``hybrid`` pausing a draft
  source that does not pay) is cheap at its next recheck and drafts again, where the running average, moved only by
  the few drafting steps of rechecks, would keep the old share for thousands of steps;
- the mode that lost is measured again for ``RECHECK_STEPS`` steps after ``FIRST_RECHECK`` steps, then after
  twice as many each time the decision stands (at most ``LAST_RECHECK``), because both change: the target's
  step grows with the context and a plugin's acceptance with what it has learned. A recheck of a mode that
  lost by a wide margin costs more, so it waits until it costs at most ``RECHECK_SHARE`` of the steps since
  the last (a draft 35% slower than plain decoding: every 350 steps at first).

The first ``SETTLE_STEPS`` steps of each phase are not measured (a draft catching up on the tokens it missed
drafts nothing at first), nor are steps far longer than the mode's average (idle time between requests).
What it costs: the first measurement of each mode (``PHASE_STEPS`` steps), then the rechecks of the slower one,
``RECHECK_STEPS`` + ``SETTLE_STEPS`` steps in ``FIRST_RECHECK`` or more at first, in ``LAST_RECHECK`` once settled. Memory: one record per
batch-size group (``policy``'s groups: sizes 1 to 8 each, then four per octave). Pure logic, no vLLM.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Optional

from freespec.scorers.policy import rows_group

from freespec.scorers.tuning import (
    COSTLY_SHARE, EARLY_STEPS, FIRST_RECHECK, GAP_FACTOR, KEEP, LAST_RECHECK, MARGIN, PHASE_STEPS, RECHECK_SHARE,
    RECHECK_STEPS, SETTLE_STEPS, WIDE_LOSS,
)


@dataclass
class _Rate:
    """Exponentially weighted seconds and tokens per step of one mode, and the steps behind them."""

    seconds: float = 0.0
    tokens: float = 0.0
    steps: int = 0

    def observe(self, seconds: float, tokens: int) -> None:
        keep = KEEP if self.steps else 0.0
        self.seconds = keep * self.seconds + (1 - keep) * seconds
        self.tokens = keep * self.tokens + (1 - keep) * tokens
        self.steps += 1

    def per_token(self) -> float:
        return self.seconds / self.tokens if self.tokens > 0 else float("inf")


@dataclass
class _Group:
    rates: dict[bool, _Rate] = field(default_factory=lambda: {True: _Rate(), False: _Rate()})
    phase: Optional[bool] = None  # the mode being measured, while a phase runs
    phase_left: int = 0
    phase_measured: int = 0  # steps measured in the current phase
    settle: int = 0  # steps of the current mode still left out of its rate
    mode: bool = True  # the mode the last step ran in
    steps: int = 0  # steps decided in this group
    next_check: int = 0
    interval: int = FIRST_RECHECK
    best: Optional[bool] = None  # the decision the last comparison made
    phase_shares: list[float] = field(default_factory=list)  # the plugin's share of each step of a drafting phase

    def forget(self) -> None:
        """Back to a group never measured (its step count and last mode kept: ``drafts`` holds the group)."""
        fresh = _Group()
        self.rates, self.best, self.phase, self.phase_left = fresh.rates, fresh.best, fresh.phase, fresh.phase_left
        self.interval, self.next_check = fresh.interval, fresh.next_check


class StepAside:
    """``drafts(rows)`` before a step: whether the plugin drafts in it; ``observe(...)`` after: what it cost."""

    def __init__(self) -> None:
        self.groups: dict[int, _Group] = {}
        self.share = 0.0  # exponentially weighted share of a drafting step's wall time spent in the plugin
        self._share_steps = 0
        # The first PHASE_STEPS drafting steps' shares: their median starts the average, since a plugin's first
        # calls carry one-time costs (a request's first suffix tree, kernels loading) that, as the average's
        # first value, made a cheap plugin look costly for its first comparison at a cold start.
        self._first_shares: list[float] = []
        self.changes: list[str] = []  # decisions not yet logged (the adapter logs and clears them)

    def _group(self, rows: int) -> _Group:
        return self.groups.setdefault(rows_group(max(1, rows)), _Group())

    def observe(self, rows: int, drafted: bool, seconds: float, produced: int, plugin_seconds: float) -> None:
        """The step that just ran: its requests, whether the plugin drafted for it, its wall time from the start
        of one adapter call to the next (the plugin's time and the engine's), the tokens it produced, and the
        plugin's own part of that time."""
        if seconds <= 0 or produced <= 0:
            return
        g = self._group(rows)
        rate = g.rates[drafted]
        if rate.steps and seconds > GAP_FACTOR * rate.seconds:
            return
        if drafted:
            share = min(1.0, plugin_seconds / seconds)
            if self._share_steps < PHASE_STEPS:
                self._first_shares.append(share)
                self.share = statistics.median(self._first_shares)
            else:
                self.share = KEEP * self.share + (1 - KEEP) * share
            self._share_steps += 1
            if g.phase is True:
                g.phase_shares.append(share)
        if g.settle > 0:
            g.settle -= 1
            return
        rate.observe(seconds, produced)
        if g.phase is drafted:
            g.phase_measured += 1

    def drafts(self, rows: int) -> bool:
        g = self._group(rows)
        g.steps += 1
        mode = self._choose(g, rows)
        if mode != g.mode:
            g.settle = SETTLE_STEPS
            g.mode = mode
        return mode

    def _choose(self, g: _Group, rows: int) -> bool:
        if g.phase_left > 0 and g.phase is True and g.best is None:
            # a first drafting measurement begun before drafting lost at fewer requests (four requests of a
            # warm-up start one while one request's is still running) stops there, as one not yet begun would
            below = self._lost_below(rows)
            if below is not None:
                g.phase, g.phase_left, g.phase_shares = None, 0, []
                return self._inherit(g, rows, below)
        cut = g.phase_left > 0 and self._losing_widely(g)
        if cut:
            g.phase_left = 0
        if g.phase_left > 0:
            g.phase_left -= 1
            return bool(g.phase)
        measured, drafting_phase, g.phase = g.phase is not None, g.phase is True, None  # a phase just ended
        if drafting_phase and g.phase_shares:
            self._phase_share(g, rows)
        if self.share < COSTLY_SHARE or self._share_steps < PHASE_STEPS:
            return True
        if g.best is None and not measured:
            below = self._lost_below(rows)
            if below is not None:
                return self._inherit(g, rows, below)
        if not measured and g.best is not None and g.steps < g.next_check:
            return g.best  # between rechecks the decision stands (no flapping on a tie)
        on, off = g.rates[True], g.rates[False]
        needed = PHASE_STEPS if g.best is None else RECHECK_STEPS  # a recheck's steps may have been gaps
        if not cut and off.steps < needed:
            return self._phase(g, False, needed)
        if not cut and on.steps < needed:
            return self._phase(g, True, needed)
        if not measured and g.best is not None:  # a recheck is due
            g.interval = min(LAST_RECHECK, 2 * g.interval)
            g.next_check = g.steps + g.interval
            g.rates[not g.best] = _Rate()
            return self._phase(g, not g.best, RECHECK_STEPS)
        best = on.per_token() <= (1 + MARGIN) * off.per_token()
        loss = max(on.per_token(), off.per_token()) / max(1e-12, min(on.per_token(), off.per_token())) - 1
        # the steps between rechecks for the slower mode's to cost at most RECHECK_SHARE of them
        paid = min(LAST_RECHECK, math.ceil((RECHECK_STEPS + SETTLE_STEPS) * loss / RECHECK_SHARE))
        if best != g.best:
            self.changes.append(
                f"{rows} request(s): {'drafts' if best else 'steps aside'}: "
                f"{on.per_token() * 1e3:.1f} ms a token drafting, {off.per_token() * 1e3:.1f} ms without")
            g.interval = max(FIRST_RECHECK, paid)
        else:
            g.interval = max(g.interval, paid)  # the decision stands: already doubled when the recheck began
        g.best = best
        g.next_check = g.steps + g.interval
        return best

    def _losing_widely(self, g: _Group) -> bool:
        """A drafting measurement, ``EARLY_STEPS`` steps in, more than ``WIDE_LOSS`` slower a token than plain
        decoding measured at this batch size."""
        on, off = g.rates[True], g.rates[False]
        return (g.phase is True and g.phase_measured >= EARLY_STEPS and off.steps >= RECHECK_STEPS
                and on.per_token() > (1 + WIDE_LOSS) * off.per_token())

    def _lost_below(self, rows: int) -> Optional[tuple[int, _Group]]:
        """The largest batch-size group under ``rows``'s that has been compared, when drafting lost there."""
        key = rows_group(max(1, rows))
        below = [(k, g) for k, g in self.groups.items() if k < key and g.best is not None]
        if not below:
            return None
        k, g = max(below, key=lambda kg: kg[0])
        return (k, g) if g.best is False else None

    def _inherit(self, g: _Group, rows: int, below: tuple[int, _Group]) -> bool:
        """A batch size not yet measured, above one where drafting lost: it steps aside from its first step,
        and is measured at its first recheck, after as many steps as that group's. Drafting's own cost grows
        with the requests (a draft model feeds and drafts for each row) while verifying costs more of a fuller
        step, so a plugin that lost at fewer requests loses at more; measuring it drafting at every new batch
        size, PHASE_STEPS of its slowest steps each time, was what cost a draft model most under load
        (docs/pearl.md, "Under load")."""
        k, source = below
        g.best, g.interval = False, source.interval
        g.next_check = g.steps + g.interval
        self.changes.append(f"{rows} request(s): steps aside as at fewer requests (group {k}); measured here "
                            f"after {g.interval} steps")
        return False

    def _phase_share(self, g: _Group, rows: int) -> None:
        """A drafting phase ended: the plugin's share is its median over the phase (a step that ran a paused
        source's probe does not count for more than one step). Cheap now where it sat out: every group drafts
        again, and is measured afresh should it become costly again."""
        self.share = statistics.median(g.phase_shares)
        g.phase_shares = []
        if self.share < COSTLY_SHARE and any(group.best is False for group in self.groups.values()):
            self.changes.append(f"{rows} request(s): drafts: its own time fell to {self.share:.1%} of a step")
            for group in self.groups.values():
                group.forget()

    def _phase(self, g: _Group, mode: bool, steps: int = PHASE_STEPS) -> bool:
        """Run ``mode`` for ``steps`` measured steps (and the steps that settle it after a switch)."""
        g.phase, g.phase_left, g.phase_measured = mode, steps + SETTLE_STEPS - 1, 0
        g.phase_shares = []
        return mode

    def stepped_aside(self) -> dict[int, bool]:
        """Per batch-size group, whether the last comparison kept the plugin out."""
        return {k: g.best is False for k, g in self.groups.items()}
