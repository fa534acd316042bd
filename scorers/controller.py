"""Whether drafting pays, and how much is drafted: the one controller the adapter asks each step.

It measures each step that ran (its time, the tokens it scored and produced) and decides the next:

- step-aside (``step_aside.StepAside``): whether a plugin whose own time is a real share of the step drafts at
  all, or sits the step out because plain decoding is faster at this batch size;
- the goodput policy (``policy.GoodputPolicy``): the price of one draft token at the measured load, where every
  draft is cut (``policy.cut``), and with one request the step size its draft is padded or trimmed to;
- source pricing (``fusion.SourcePricing``): which of a fusing plugin's sources pay for their own time. It runs
  inside ``hybrid``, the one plugin that sees its sources, and leaves its time out of the policy's fit
  (``Proposer.prices_own_time``).

Every tuning constant of the three is in ``tuning``, with its meaning. Pure logic, no vLLM.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from freespec.proposers.api import Draft
from freespec.scorers.policy import GoodputPolicy, ShapedDrafts, shape_drafts
from freespec.scorers.step_aside import StepAside


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
