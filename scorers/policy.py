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

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from freespec.proposers.api import Draft
from freespec.scorers.padding import context_padding

from freespec.scorers.tuning import (
    BANDWIDTH_OCTAVES, EXACT_ROWS, EXACT_SIZES, EXPLORE_EVERY, GOODPUT_HALFLIFE_STEPS, HALFLIFE_STEPS, MIN_LOCAL_WEIGHT,
    MIN_SPREAD, MIN_STEPS, PAD_EXPLORE_EVERY, PAD_MARGIN, PAD_MIN_STEPS, PAD_REFRESH_EVERY, ROWS_BANDWIDTH_OCTAVES,
    ROWS_GROUPS_PER_OCTAVE, ROWS_REACH_OCTAVES, SIZE_BUCKETS_PER_OCTAVE, SLOPE_ERRORS,
)

# Why the fit is local. Step time is not one line: a CPU or GPU is memory-bound at a few tokens a step and
# compute-bound at many, so the cost of one more token grows with T, and one line through both regimes
# under-prices draft tokens in a full batch, exactly where a wrong price costs throughput; so the fit at a load
# weighs steps of similar size (BANDWIDTH_OCTAVES). At the same T a step of more requests costs more (each has its
# own attention, sampling and bookkeeping): steps of one request beside steps of four would read as a steep
# per-token slope that is the cost of the requests, so it also weighs steps of about as many requests
# (ROWS_BANDWIDTH_OCTAVES, ROWS_REACH_OCTAVES). Step time is not even monotonic in T: on some CPUs a step scoring
# 1 token takes longer than one scoring 3 to 6, hence the step size (``GoodputPolicy.step_size``; docs/policy.md).


def _log_bucket(value: float, exact: int, per_octave: int) -> int:
    """Each whole value up to ``exact`` its own bucket, then ``per_octave`` buckets per octave."""
    return int(value) if value <= exact else exact + round(per_octave * math.log2(value / exact))


def rows_group(rows: int) -> int:
    """Batch sizes grouped: 1 to 8 requests each their own group, then four groups per octave."""
    return _log_bucket(rows, EXACT_ROWS, ROWS_GROUPS_PER_OCTAVE)


def _group_rows(group: int) -> float:
    """The number of requests a group stands for (its centre, above ``EXACT_ROWS``)."""
    return float(group) if group <= EXACT_ROWS else EXACT_ROWS * 2.0 ** ((group - EXACT_ROWS) / ROWS_GROUPS_PER_OCTAVE)


def _decay(steps_since: int) -> float:
    """What an observation made ``steps_since`` steps ago still weighs."""
    return 0.5 ** (steps_since / HALFLIFE_STEPS)


def _bucket(tokens: float) -> int:
    """Steps are summarised per size: each T up to ``EXACT_SIZES``, then eight buckets per octave."""
    return _log_bucket(tokens, EXACT_SIZES, SIZE_BUCKETS_PER_OCTAVE)


@dataclass
class StepTimeModel:
    """Online fit of step seconds = base + per_token * tokens, globally or locally around a step size and a
    number of requests.

    Steps are grouped by their number of requests (``rows_group``) and, within a group, bucketed by size;
    each bucket keeps exponentially weighted least-squares sums (weight, sum T, sum y, sum T^2, sum T*y, sum y^2),
    decayed by the number of steps observed since (half-life ``HALFLIFE_STEPS``), so memory is bounded by the
    number of groups (8, then 4 per octave of requests) times buckets (about 100).
    """

    steps: int = 0

    def __post_init__(self) -> None:
        # requests group -> size bucket -> (sums, step of last update)
        self._groups: dict[int, dict[int, tuple[tuple[float, ...], int]]] = {}
        # size of one-request steps -> (mean seconds, steps observed ever): a bucket's weights all decay by one
        # factor, so its mean changes only when it is observed
        self._means: dict[int, tuple[float, int]] = {}

    def observe(self, tokens: float, seconds: float, rows: int = 1) -> None:
        key = _bucket(tokens)
        buckets = self._groups.setdefault(rows_group(max(1, rows)), {})
        sums, stamp = buckets.get(key, ((0.0,) * 6, self.steps))
        keep = _decay(self.steps - stamp)
        n, t, y, tt, ty, yy = sums
        sums = (keep * n + 1.0, keep * t + tokens, keep * y + seconds, keep * tt + tokens * tokens,
                keep * ty + tokens * seconds, keep * yy + seconds * seconds)
        buckets[key] = (sums, self.steps)
        if rows <= 1 and tokens <= EXACT_SIZES:
            self._means[key] = (sums[2] / sums[0], self._means.get(key, (0.0, 0))[1] + 1)
        self.steps += 1

    @property
    def means(self) -> dict[int, tuple[float, int]]:
        """Size -> (mean seconds, steps observed) of one-request steps that scored exactly that many tokens,
        for every size up to ``EXACT_SIZES`` observed so far (read-only; what the step size is chosen from,
        and it is chosen only for one request). The mean weighs each step by its age (half-life
        ``HALFLIFE_STEPS`` steps observed); the count is of every step ever, so a size measured once is not
        measured again only because time passed."""
        return self._means

    def fit(self, at: Optional[float] = None, rows: Optional[int] = None,
            errors: float = 0.0) -> Optional[tuple[float, float]]:
        """(base seconds, seconds per token), or None while the slope is not identified.

        ``at``: the line that best describes steps of about ``at`` tokens (kernel-weighted in
        log T, ``BANDWIDTH_OCTAVES``); ``rows``: and of about that many requests (kernel-weighted in log
        requests, ``ROWS_BANDWIDTH_OCTAVES``; groups beyond ``ROWS_REACH_OCTAVES`` left out). None for
        both: one line through every step. ``errors``: the slope less that many of its standard errors
        (from the weighted residuals, the weight taken as the number of steps), the base refitted through
        the mean step for it: a slope fitted to steps of nearly one size is noisy, and the price must not
        read steeper than the steps show.
        """
        if self.steps < MIN_STEPS:
            return None
        # Runs every engine step: plain locals, no per-bucket calls beyond the kernel's log and exp.
        weight = sum_t = sum_y = sum_tt = sum_ty = sum_yy = 0.0
        steps, centre = self.steps, max(at, 0.5) if at is not None else 0.0
        for group, buckets in self._groups.items():
            near = 1.0
            if rows is not None:
                octaves = math.log2(_group_rows(group) / max(rows, 1))
                if abs(octaves) > ROWS_REACH_OCTAVES:
                    continue
                octaves /= ROWS_BANDWIDTH_OCTAVES
                near = math.exp(-0.5 * octaves * octaves)
            for sums, stamp in buckets.values():
                w = near * 0.5 ** ((steps - stamp) / HALFLIFE_STEPS)
                n, t, y, tt, ty, yy = sums
                if at is not None and n > 0:
                    octaves = math.log2(max(t / n, 0.5) / centre) / BANDWIDTH_OCTAVES
                    w *= math.exp(-0.5 * octaves * octaves)
                weight += w * n
                sum_t += w * t
                sum_y += w * y
                sum_tt += w * tt
                sum_ty += w * ty
                sum_yy += w * yy
        if weight <= 0 or ((at is not None or rows is not None) and weight < MIN_LOCAL_WEIGHT):
            return None
        mean_t = sum_t / weight
        var_t = sum_tt / weight - mean_t * mean_t
        if var_t < MIN_SPREAD**2:
            return None
        mean_y = sum_y / weight
        covariance = sum_ty / weight - mean_t * mean_y
        per_token = covariance / var_t
        if errors > 0 and weight > 2:
            residual = max(0.0, sum_yy / weight - mean_y * mean_y - per_token * covariance)
            per_token -= errors * math.sqrt(residual / (weight - 2) / var_t)
        per_token = max(0.0, per_token)
        base = max(0.0, mean_y - per_token * mean_t)
        return base, per_token


@dataclass
class GoodputPolicy:
    """Tracks step time and output per step; ``token_cost()`` is the acceptance a draft token must beat."""

    model: StepTimeModel
    output_per_row: float = 0.0  # exponentially weighted tokens a request gains per step
    scored_per_row: float = 0.0  # exponentially weighted tokens a request is scored at per step (1 + draft)
    rows_per_step: float = 0.0  # exponentially weighted number of requests in a step

    def __init__(self) -> None:
        self.model = StepTimeModel()
        self.output_per_row = self.scored_per_row = self.rows_per_step = 0.0
        self._calls = 0
        self._pad_calls = 0

    def observe_step(self, scored_tokens: int, output_tokens: int, seconds: float, rows: int = 1) -> None:
        if seconds <= 0 or scored_tokens <= 0:
            return
        rows = max(1, rows)
        self.model.observe(scored_tokens, seconds, rows)
        keep = 0.0 if self.rows_per_step == 0.0 else 0.5 ** (1.0 / GOODPUT_HALFLIFE_STEPS)
        self.output_per_row = keep * self.output_per_row + (1 - keep) * output_tokens / rows
        self.scored_per_row = keep * self.scored_per_row + (1 - keep) * scored_tokens / rows
        self.rows_per_step = keep * self.rows_per_step + (1 - keep) * rows

    def token_cost(self, rows: Optional[int] = None) -> Optional[float]:
        """per_token * goodput (clamped to [0, 1]); None (the plugin's fixed bar) until the fit is identified.

        ``rows``: the requests in the step being drafted for (default: the recent average). Both
        the price of a token and the goodput it is weighed against are taken at that batch size:
        the step-time line fitted around the steps it runs (``fit(at=rows * scored_per_row, rows=rows)``;
        while that is not identified, the steps of that size whatever their requests, then every step), and goodput as
        ``rows`` requests would get it, each gaining ``output_per_row`` tokens per step of
        ``rows * scored_per_row`` scored tokens (or 1 of 1, plain decoding, whichever is
        higher). So the bar moves in the step the load does, not a few dozen steps later, which
        matters when a burst of requests lasts only a hundred steps.

        A proposer whose drafts all have the same length gives the fit no spread in T to learn the
        slope from, so until it is identified every ``EXPLORE_EVERY``-th step returns 0 (draft as
        deep as possible) to create that spread.
        """
        self._calls += 1
        rows = float(max(1, rows)) if rows is not None else max(1.0, self.rows_per_step)
        # Centre the local fit on the steps this batch runs (its requests and their recent drafts); while steps of
        # about as many requests are too few, on the steps of that size, whatever their requests.
        at = rows * max(1.0, self.scored_per_row)
        fit = (self.model.fit(at=at, rows=round(rows), errors=SLOPE_ERRORS) or self.model.fit(at=at, errors=SLOPE_ERRORS)
               or self.model.fit(errors=SLOPE_ERRORS))
        if fit is None:
            return 0.0 if self._calls % EXPLORE_EVERY == 0 else None
        base, per_token = fit

        def goodput(gained: float, scored: float) -> float:
            seconds = base + per_token * rows * scored
            return rows * gained / seconds if seconds > 0 else 0.0

        best = max(goodput(self.output_per_row, self.scored_per_row), goodput(1.0, 1.0))
        return min(1.0, max(0.0, per_token * best))

    def step_size(self, scored: int, most: int, chances: Optional[Sequence[float]] = None) -> int:
        """The tokens a step that would score ``scored`` should score instead (at most ``most``, within the
        sizes measured one by one): the size with the most expected output per second of its measured steps,
        when that is at least ``PAD_MARGIN`` more than ``scored``'s own; else ``scored``.

        A larger size pads the draft: padding is expected to add nothing, so it wins only where its steps
        are faster. ``chances`` (the chance that each draft token and all before it are accepted, as the
        proposer estimates it; ``scored - 1`` of them) also lets a smaller size win: the draft's last tokens
        are dropped where what they are expected to add is worth less than the time their larger step costs.
        Without ``chances`` the draft is only ever padded. The target's verification keeps the output what
        it would have been either way.

        Every ``PAD_EXPLORE_EVERY``-th call, while some size in range was observed fewer than
        ``PAD_MIN_STEPS`` times, it returns the least observed one, so every size gets measured (once:
        after that a size is observed again when it is chosen, or drafted to). Every
        ``PAD_REFRESH_EVERY``-th call returns ``scored``, so that the step's own size, which the choice
        would otherwise never let run again, is measured as the context grows.
        """
        most = min(max(most, scored), EXACT_SIZES)
        least = 1 if chances is not None else scored
        if most <= least:
            return scored
        self._pad_calls += 1
        if self._pad_calls % PAD_REFRESH_EVERY == 0:
            return scored
        means = self.model.means
        if self._pad_calls % PAD_EXPLORE_EVERY == 0:
            unknown = min(range(least, most + 1), key=lambda t: (means.get(t, (0.0, 0))[1], t))
            if means.get(unknown, (0.0, 0))[1] < PAD_MIN_STEPS:
                return unknown
        own = means.get(scored)
        if own is None or own[1] < PAD_MIN_STEPS or own[0] <= 0:
            return scored
        expected = [1.0]  # tokens a step scoring 1, 2, ... tokens is expected to produce
        for i in range(scored - 1):
            expected.append(expected[-1] + (min(1.0, max(0.0, chances[i])) if chances is not None else 1.0))
        own_rate = expected[-1] / own[0]
        # the size with the best rate among those measured enough; the one nearer ``scored`` on a tie
        best, best_key = scored, (own_rate, 0)
        for t in range(least, most + 1):
            seconds, seen = means.get(t, (0.0, 0))
            if seen >= PAD_MIN_STEPS and seconds > 0:
                key = (expected[min(t, scored) - 1] / seconds, -abs(t - scored))
                if key > best_key:
                    best, best_key = t, key
        return best if (1.0 - PAD_MARGIN) * best_key[0] >= own_rate else scored


def paying_prefix(chances: Sequence[float], bar: float) -> int:
    """Tokens of a draft worth verifying: while the chance that the prefix is accepted (``Draft.chances``) is
    at least ``bar``, the price of one more draft token in expected accepted tokens."""
    n = 0
    for p in chances:
        if p < bar:
            break
        n += 1
    return n


def cut(draft: Draft, bar: Optional[float]) -> Draft:
    """``draft`` cut where it stops paying at ``bar``: the goodput cut, the one place it is decided. A draft
    without chances, or no bar (the fixed policy of a proposer without one), is left whole."""
    if bar is None or draft.chances is None:
        return draft
    n = paying_prefix(draft.chances, bar)
    if n >= len(draft.tokens):
        return draft
    return Draft(draft.tokens[:n], draft.chances[:n], draft.source)


@dataclass
class ShapedDrafts:
    """What the policy makes of one step's drafts: the token ids vLLM is given, and how they were shaped."""

    tokens: list[list[int]]
    padding: list[int]  # per row: filler tokens appended to reach a faster step size
    trimmed: int = 0  # draft tokens dropped for a step size that pays better
    expected: float = 0.0  # draft tokens (not padding) the proposer expected accepted, where it says


def shape_drafts(drafts: Sequence[Draft], bar: Optional[float], policy: Optional[GoodputPolicy],
                 contexts: Sequence[np.ndarray], rooms: Sequence[int], pad: bool = True,
                 trim: bool = True) -> ShapedDrafts:
    """One step's drafts as vLLM takes them: each cut at ``bar`` (``cut``) and at its row's ``rooms[i]``
    (tokens it may add: k, the model's length, 0 mid-prefill); then, with ``policy`` and ``pad``, a step of
    one decoding request padded or trimmed to the size with the most expected output per measured second
    (``GoodputPolicy.step_size``: only there was a larger step measured faster, docs/policy.md); ``trim``
    lets it drop a draft's last tokens where the proposer gave their chances. ``contexts[i]``: the row's
    tokens so far, which the padding continues."""
    shaped = [cut(d, bar) for d in drafts]
    tokens = [d.tokens[: max(0, room)] for d, room in zip(shaped, rooms)]
    out = ShapedDrafts(tokens, [0] * len(tokens))
    if policy is None or not pad or len(tokens) != 1 or rooms[0] <= 0:
        return out
    draft, chances = tokens[0], shaped[0].chances
    chances = [float(c) for c in chances[: len(draft)]] if trim and chances and len(chances) >= len(draft) else None
    extra = policy.step_size(1 + len(draft), 1 + max(len(draft), rooms[0]), chances) - 1 - len(draft)
    if extra < 0:
        out.trimmed = -extra
        draft = draft[:extra]
    if chances is not None:
        out.expected = sum(chances[: len(draft)])
    if extra > 0:
        out.padding = [extra]
        draft = draft + context_padding(contexts[0], draft, extra)
    out.tokens = [draft]
    return out
