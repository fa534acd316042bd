"""Load-aware speculation: how much one more draft token must be worth, measured online (goodput).

A step that scores ``T`` tokens (every request's last token plus its draft tokens, plus prompt
tokens being prefilled) takes ``t(T) ~ base + per_token * T`` seconds. ``StepTimeModel`` fits
that line online from the time between consecutive steps and the tokens each step scored
(exponentially weighted least squares, so it follows the machine and the load; nothing is
assumed about the hardware).

Goodput is output tokens per second, ``G = N / t`` (``N``: tokens the step produced). One more
draft token costs ``per_token`` seconds and yields ``q`` expected tokens (its chance of being
accepted, given the tokens before it are). It raises goodput exactly when
``(N + q) / (t + per_token) > N / t``, i.e. when ``q > per_token * N / t = per_token * G``.
Measured goodput is only as good as the drafts being verified (wasteful drafts lower it and with it
the bar), so ``G`` is taken as the larger of the measured goodput and the goodput the fit predicts
for decoding without drafts (``rows / (base + per_token * rows)``): every draft token must at least
beat plain decoding, which is what keeps speculation from costing throughput under load.
That product, ``token_cost``, is the threshold every freespec proposer uses in place of its
fixed ``min_token_gain``: near 0 where verifying extra tokens is almost free (a memory-bound
GPU at small batch: speculate as deep as acceptance allows), near 1 when the batch already
fills the machine (only near-certain tokens are worth verifying), and 0-draft when nothing
clears it. This is SmartSpec's goodput criterion applied per token.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

HALFLIFE_STEPS = 256.0  # evidence half-life of the step-time fit
MIN_STEPS = 16  # observations before the fit is trusted
MIN_SPREAD = 0.5  # tokens: below this standard deviation of T the slope is not identified
EXPLORE_EVERY = 8  # while it is not, every 8th step drafts as deep as the proposer can, to vary T


@dataclass
class StepTimeModel:
    """Online fit of step seconds = base + per_token * tokens."""

    weight: float = 0.0
    sum_t: float = 0.0
    sum_y: float = 0.0
    sum_tt: float = 0.0
    sum_ty: float = 0.0
    steps: int = 0

    def observe(self, tokens: float, seconds: float) -> None:
        keep = 0.5 ** (1.0 / HALFLIFE_STEPS)
        self.weight = keep * self.weight + 1.0
        self.sum_t = keep * self.sum_t + tokens
        self.sum_y = keep * self.sum_y + seconds
        self.sum_tt = keep * self.sum_tt + tokens * tokens
        self.sum_ty = keep * self.sum_ty + tokens * seconds
        self.steps += 1

    def fit(self) -> Optional[tuple[float, float]]:
        """(base seconds, seconds per token), or None while the slope is not identified."""
        if self.steps < MIN_STEPS or self.weight <= 0:
            return None
        mean_t = self.sum_t / self.weight
        var_t = self.sum_tt / self.weight - mean_t * mean_t
        if var_t < MIN_SPREAD**2:
            return None
        per_token = (self.sum_ty / self.weight - mean_t * self.sum_y / self.weight) / var_t
        per_token = max(0.0, per_token)
        base = max(0.0, self.sum_y / self.weight - per_token * mean_t)
        return base, per_token


@dataclass
class GoodputPolicy:
    """Tracks step time and output per step; ``token_cost()`` is the acceptance a draft token must beat."""

    model: StepTimeModel
    output_per_step: float = 0.0  # exponentially weighted N
    seconds_per_step: float = 0.0  # exponentially weighted t
    rows_per_step: float = 0.0  # exponentially weighted number of requests in a step

    def __init__(self) -> None:
        self.model = StepTimeModel()
        self.output_per_step = self.seconds_per_step = self.rows_per_step = 0.0
        self._calls = 0

    def observe_step(self, scored_tokens: int, output_tokens: int, seconds: float, rows: int = 1) -> None:
        if seconds <= 0 or scored_tokens <= 0:
            return
        self.model.observe(scored_tokens, seconds)
        keep = 0.0 if self.seconds_per_step == 0.0 else 0.5 ** (1.0 / 32)
        self.output_per_step = keep * self.output_per_step + (1 - keep) * output_tokens
        self.seconds_per_step = keep * self.seconds_per_step + (1 - keep) * seconds
        self.rows_per_step = keep * self.rows_per_step + (1 - keep) * rows

    def token_cost(self) -> Optional[float]:
        """per_token * goodput (clamped to [0, 1]); None (the plugin's fixed bar) until the fit is identified.

        A proposer whose drafts all have the same length gives the fit no spread in T to learn the
        slope from, so until it is identified every ``EXPLORE_EVERY``-th step returns 0 (draft as
        deep as possible) to create that spread.
        """
        self._calls += 1
        fit = self.model.fit()
        if fit is None or self.seconds_per_step <= 0:
            return 0.0 if self._calls % EXPLORE_EVERY == 0 else None
        base, per_token = fit
        measured = self.output_per_step / self.seconds_per_step
        rows = max(1.0, self.rows_per_step)
        plain = rows / (base + per_token * rows) if base + per_token * rows > 0 else 0.0
        return min(1.0, max(0.0, per_token * max(measured, plain)))
