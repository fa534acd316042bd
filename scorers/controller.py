"""Whether drafting pays, and how much is drafted: the one controller the adapter asks each step.

It measures each step that ran (its time, the tokens it scored and produced) and decides the next:

- step-aside (``step_aside.StepAside``): whether a plugin whose own time is a real share of the step drafts at
  all, or sits the step out because plain decoding is faster at this batch size;
- the goodput policy (``policy.GoodputPolicy``): the price of one draft token at the measured load, where every
  draft is cut (``policy.cut``), and with one request the step size its draft is padded or trimmed to;
- source pricing (``SourcePricing``, below): which of a fusing plugin's sources pay for their own time. It runs
  inside ``hybrid``, the one plugin that sees its sources, and leaves its time out of the policy's fit
  (``Proposer.prices_own_time``).

Every tuning constant of the three is in ``tuning``, with its meaning. Pure logic, no vLLM.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from freespec.proposers.api import Draft
from freespec.scorers.policy import GoodputPolicy, ShapedDrafts, shape_drafts
from freespec.scorers.step_aside import StepAside
from freespec.scorers.tuning import (
    CHEAP_SHARE, EVIDENCE_STEPS, FEW_EVIDENCE, MIN_EVIDENCE, PRICE_GAP_FACTOR, PRICE_KEEP, PROBE_EVERY, PROBE_SHARE,
    RESUME_MARGIN,
)


class DraftController:
    """``step`` before each engine step's drafting; ``shape`` on what the plugin returns."""

    def __init__(self, policy: str = "goodput", pad: str = "auto", step_aside: bool = True) -> None:
        # "policy": "goodput" (the default) prices draft tokens at the load; "fixed" leaves each plugin its own bar.
        self.policy = GoodputPolicy() if policy == "goodput" else None
        pad = pad if self.policy is not None else "off"
        self.pad, self.trim = pad != "off", pad == "auto"
        self.step_aside = StepAside() if step_aside else None

    def step(self, rows: int, counted: Optional[tuple[int, int]], now: float, last_started: Optional[float],
             last_rows: int, last_drafted: bool, last_plugin_s: float, own_time_s: float,
             cost: Optional[float]) -> tuple[bool, Optional[float]]:
        """Measure the step that just ran and decide this one: (whether the plugin drafts, the price of a draft
        token; ``cost``, the last price, while the policy is off).

        ``counted``: (tokens scored, tokens produced) by the step that ran, None where it prefilled;
        ``last_started``: when the adapter call before it began (None: a gap, nothing measured);
        ``last_rows``, ``last_drafted``, ``last_plugin_s``: that call's requests, whether the plugin drafted in
        it, its own seconds; ``own_time_s``: seconds of it the policy's fit leaves out (a plugin that prices
        its own time)."""
        drafts = True
        if self.step_aside is not None:
            if last_started is not None and counted is not None:
                self.step_aside.observe(last_rows, last_drafted, now - last_started, counted[1], last_plugin_s)
            drafts = self.step_aside.drafts(rows)
        if self.policy is not None:
            if last_started is not None and counted is not None:
                # Stepping aside, the last step's own time stays in: it is what plain decoding is measured against.
                left_out = own_time_s if drafts else 0.0
                self.policy.observe_step(counted[0], counted[1], now - last_started - left_out, rows=rows)
            cost = self.policy.token_cost(rows=rows)
        return drafts, cost

    def changes(self) -> list[str]:
        """Step-aside's decisions since the last call, to log."""
        if self.step_aside is None or not self.step_aside.changes:
            return []
        out, self.step_aside.changes = self.step_aside.changes, []
        return out

    def shape(self, drafts: Sequence[Draft], bar: Optional[float], contexts: Sequence[np.ndarray],
              rooms: Sequence[int]) -> ShapedDrafts:
        """One step's drafts as vLLM takes them: cut at ``bar``, within each row's room, and with one request
        padded or trimmed to the fastest measured step size (``policy.shape_drafts``)."""
        return shape_drafts(drafts, bar, self.policy, contexts, rooms, self.pad, self.trim)

    def fit(self) -> Optional[tuple[float, float]]:
        """The policy's step-time fit (base seconds, seconds per token), for metrics; None without one."""
        return self.policy.model.fit() if self.policy is not None else None


@dataclass
class _Price:
    seconds: float = 0.0  # this source's own time per step it runs
    right: float = 0.0  # tokens per step only it got right (beyond the best other source)
    steps: int = 0  # steps run
    paused_at: Optional[int] = None
    cost_at: int = 0  # the step of the last cost observation, and of the last tokens observation
    right_at: int = 0


class SourcePricing:
    """Which sources pay for themselves: own seconds per step against what only they add.

    The caller reports, per step, the time between engine steps (``observe_step``), each source's
    own time (``observe_cost``), which sources ran (``step_done``) and, for the rows learned at the
    start of the next step, the tokens each source alone got right and the tokens produced
    (``observe_tokens``). A source's value is its unique tokens per step times the seconds one output
    token takes (step seconds / tokens produced per step). A source whose value stays below its cost
    after ``MIN_EVIDENCE`` steps (fewer for a source slow next to the step: ``_evidence``) is paused, except
    the last one running and one cheaper than ``CHEAP_SHARE`` of a step; a paused source runs one step in
    ``PROBE_EVERY`` (more for a slow one: ``_probe_every``), and is resumed once its value is back above
    ``RESUME_MARGIN`` times its cost (or its cost below ``CHEAP_SHARE`` of a step).
    """

    def __init__(self, names: tuple[str, ...]) -> None:
        self.prices = {name: _Price() for name in names}
        self.step = 0
        self.step_seconds = 0.0
        self.produced = 0.0  # tokens produced per step
        self._last_run: tuple[str, ...] = ()

    def value(self, name: str) -> float:
        """Seconds per step the tokens only ``name`` got right are worth."""
        if self.produced <= 0:
            return 0.0
        return self.prices[name].right * self.step_seconds / self.produced

    def runs(self, name: str) -> bool:
        p = self.prices[name]
        return p.paused_at is None or (self.step - p.paused_at) % self._probe_every(p) == 0

    def _probe_every(self, p: _Price) -> int:
        """A paused source's probe interval: ``PROBE_EVERY`` steps, longer for a source whose one step costs
        more than ``PROBE_SHARE`` of ``PROBE_EVERY`` engine steps."""
        if self.step_seconds <= 0:
            return PROBE_EVERY
        return max(PROBE_EVERY, math.ceil(p.seconds / (PROBE_SHARE * self.step_seconds)))

    def _evidence(self, p: _Price) -> int:
        """Steps a source runs before it is judged: ``MIN_EVIDENCE``, fewer (not below ``FEW_EVIDENCE``) for a
        source whose evidence would otherwise cost more than ``EVIDENCE_STEPS`` engine steps of time."""
        if p.seconds <= 0 or self.step_seconds <= 0:
            return MIN_EVIDENCE
        return min(MIN_EVIDENCE, max(FEW_EVIDENCE, math.ceil(EVIDENCE_STEPS * self.step_seconds / p.seconds)))

    def paused(self) -> list[str]:
        return [name for name, p in self.prices.items() if p.paused_at is not None]

    def describe(self) -> str:
        """Each source's own ms per step against the ms per step its unique tokens are worth."""
        return ", ".join(f"{name}: {p.seconds * 1e3:.2f} ms for {self.value(name) * 1e3:.2f} ms"
                         for name, p in self.prices.items())

    def observe_step(self, seconds: float) -> None:
        """Time since the last step (gaps far longer than usual, such as idle time between requests, are skipped)."""
        if seconds <= 0 or (self.step_seconds > 0 and seconds > PRICE_GAP_FACTOR * self.step_seconds):
            return
        keep = PRICE_KEEP if self.step_seconds > 0 else 0.0
        self.step_seconds = keep * self.step_seconds + (1 - keep) * seconds

    def _keep(self, since: int, observed: bool) -> float:
        """What an average last updated at step ``since`` keeps at this step: it ages by engine steps, not by
        the steps its source ran, so a paused source's estimates (a start-up spike in its cost, say) give way
        to its next probes instead of lasting for thousands of steps."""
        return PRICE_KEEP ** max(1, self.step - since) if observed else 0.0

    def observe_cost(self, name: str, seconds: float) -> None:
        p = self.prices[name]
        keep = self._keep(p.cost_at, p.steps > 0)
        p.seconds = keep * p.seconds + (1 - keep) * seconds
        p.cost_at = self.step

    def observe_tokens(self, right: dict[str, int], produced: int) -> None:
        """Unique right tokens of the last step's sources; each one that ran counts, contributing or not."""
        if not self._last_run or produced <= 0:
            return
        keep = PRICE_KEEP if self.produced > 0 else 0.0
        self.produced = keep * self.produced + (1 - keep) * produced
        for name in self._last_run:
            p = self.prices[name]
            k = self._keep(p.right_at, p.steps > 0)
            p.right = k * p.right + (1 - k) * right.get(name, 0)
            p.right_at = self.step
            p.steps += 1
        self._judge()

    def step_done(self, ran: tuple[str, ...]) -> None:
        self._last_run = ran
        self.step += 1

    def _judge(self) -> None:
        for name in self._last_run:
            p = self.prices[name]
            value = self.value(name)
            cheap = p.seconds < CHEAP_SHARE * self.step_seconds
            pays = cheap or value >= p.seconds
            if p.paused_at is not None and (cheap or value >= RESUME_MARGIN * p.seconds):
                p.paused_at = None
            elif (p.paused_at is None and not pays and p.steps >= self._evidence(p)
                  and any(q.paused_at is None for other, q in self.prices.items() if other != name)):
                p.paused_at = self.step
