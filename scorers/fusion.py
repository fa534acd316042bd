"""Fuse candidate chains from several sources into one draft by longest common prefix (RASD-style).

Each source offers chains (token sequences) with a weight per chain. The draft descends from
the empty prefix; at each depth a source supports each next token with its chance of being
accepted given the draft so far: the share of its chains still on the draft's path that go on
with that token (their weight among those chains), times the source's learned per-token
acceptance. Sources add their support, the token with the most is drafted, and the descent stops
when the best support falls below ``min_support`` (so a draft may be empty). With retrieval
alone this is REST's choice: follow the continuation most occurrences agree on, while enough of
them agree. Where two sources agree the draft is confident, and where only one source knows
something, that source decides.

A source's per-token acceptance is, in order: its own per-token chances (``token_probs``: the
``suffix`` source's calibrated tree probabilities), its ``calibration`` (a ``TokenCalibration``
that turns the share and the match length into a learned chance: the ``retrieval`` source), or
its learned acceptance rate (``SourceWeights``: the rate at which tokens it supported were
accepted, so a source that is often wrong for this workload counts for less).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import numpy as np
from freespec.scorers.acceptance import AcceptanceEstimate
from freespec.proposers.api import Candidates, Draft
from freespec.scorers.policy import cut
from freespec.scorers.tuning import (
    CHEAP_SHARE, EVIDENCE_STEPS, FEW_EVIDENCE, MIN_EVIDENCE, PRICE_GAP_FACTOR, PRICE_KEEP, PROBE_EVERY, PROBE_SHARE,
    RESUME_MARGIN, WEIGHT_WINDOW,
)


def fuse(sources: list[Candidates], max_len: int, min_support: float) -> tuple[list[int], list[float], dict[str, int]]:
    """(draft, support of each draft token, how many leading draft tokens each source supported)."""
    offering = [s for s in sources if len(s.chains)]
    if len(offering) == 1 and len(offering[0].chains) == 1 and offering[0].weights[0] > 0:
        # one chain: no descent to choose (most steps)
        return _one_chain(offering[0], max_len, min_support, {s.name: 0 for s in sources})
    alive = []
    for s in sources:
        total = float(s.weights.sum())
        if len(s.chains) and total > 0:
            alive.append((s, np.ones(len(s.chains), dtype=bool), s.weights / total))
    draft: list[int] = []
    supports: list[float] = []
    supported = {s.name: 0 for s in sources}
    for depth in range(max_len):
        scores: dict[int, float] = {}
        for s, mask, w in alive:
            if depth < s.chains.shape[1] and mask.any():
                _support(s, mask, w, depth, scores)
        if not scores:
            break
        token, best = max(scores.items(), key=lambda kv: (kv[1], -kv[0]))
        if best < min_support:
            break
        draft.append(token)
        supports.append(best)
        for s, mask, _ in alive:
            if depth < s.chains.shape[1]:
                mask &= s.chains[:, depth] == token
            else:
                mask[:] = False
            if mask.any() and supported[s.name] == depth:
                supported[s.name] = depth + 1
    return draft, supports, supported


def _support(s: Candidates, mask: np.ndarray, w: np.ndarray, depth: int, scores: dict[int, float]) -> None:
    """Add source ``s``'s support of each token at ``depth`` to ``scores``: the share of its chains still on the
    draft's path (``mask``) that go on with the token, times its chance of being accepted."""
    col = s.chains[mask, depth].tolist()
    share = w[mask]
    share = (share / share.sum()).tolist()
    if s.calibration is not None:
        by_token: dict[int, float] = {}
        for token, x in zip(col, share):
            if token >= 0:
                by_token[token] = by_token.get(token, 0.0) + x
        for token, x in by_token.items():
            scores[token] = scores.get(token, 0.0) + s.calibration.chance(x, s.match_len, depth)
        return
    chance = s.token_probs[mask, depth].tolist() if s.token_probs is not None else [s.source_weight] * len(col)
    for token, x, p in zip(col, share, chance):
        if token >= 0:
            scores[token] = scores.get(token, 0.0) + x * p


def _one_chain(s: Candidates, max_len: int, min_support: float,
               supported: dict[str, int]) -> tuple[list[int], list[float], dict[str, int]]:
    """``fuse`` when a single chain is offered: its tokens while each one's support (its token chance, its
    calibrated chance, or the source's weight) is at least ``min_support``, up to the first padding."""
    n = min(max_len, s.chains.shape[1])
    chain = s.chains[0, :n].tolist()
    if s.token_probs is not None:
        support = s.token_probs[0, :n].tolist()
    elif s.calibration is not None:
        support = [s.calibration.chance(1.0, s.match_len, depth) for depth in range(n)]
    else:
        support = [s.source_weight] * n
    draft: list[int] = []
    for token, weight in zip(chain, support):
        if token < 0 or weight < min_support:
            break
        draft.append(token)
    supported[s.name] = len(draft)
    return draft, support[: len(draft)], supported


def prefix_chances(support: list[float]) -> list[float]:
    """The chance that each draft token and all before it are accepted: the product of the per-token
    supports, each capped at 1."""
    p, out = 1.0, []
    for s in support:
        p *= min(1.0, max(0.0, s))
        out.append(p)
    return out


class FusedDraft(NamedTuple):
    tokens: list[int]
    supported: dict[str, int]  # source -> leading draft tokens it supported
    sources: list[Candidates]  # the candidates fused, named and weighted
    chances: list[float]  # per draft token: the chance it and the tokens before it are accepted
    paying: int  # leading tokens the policy keeps at the bar fused with (all of them without one)


def fuse_sources(offered: dict[str, Optional[Candidates]], weights: SourceWeights, max_len: int,
                 min_support: float, token_cost: Optional[float]) -> FusedDraft:
    """One request's draft from its sources' candidates (None: the source has none): each named and
    weighted by its learned acceptance, and fused. The draft is whole (the policy cuts it); with a bar
    (``token_cost``) ``supported`` counts only the leading tokens the policy will keep (``scorers.policy.cut``),
    which is what the sources are then judged on."""
    sources = []
    for name, found in offered.items():
        if found is not None:
            found.name, found.source_weight = name, weights.weight(name)
            sources.append(found)
    draft, support, supported = fuse(sources, max_len, min_support)
    chances = prefix_chances(support)
    kept = len(draft)
    if token_cost is not None:
        kept = len(cut(Draft(draft, chances), token_cost).tokens)  # what the policy will keep of it
        supported = {name: min(n, kept) for name, n in supported.items()}
    return FusedDraft(draft, supported, sources, chances, kept)


@dataclass
class SourceWeights:
    """How often each source's supported draft tokens are accepted (per-token Beta estimate)."""

    estimates: dict[str, AcceptanceEstimate] = field(default_factory=dict)

    def weight(self, name: str) -> float:
        return self.estimates.setdefault(name, AcceptanceEstimate()).alpha

    def can_pay(self, name: str, token_cost: Optional[float]) -> bool:
        """Whether ``name``'s drafts can clear the policy's bar on their own (always, with fixed bars).

        A source whose tokens are accepted less often than one draft token costs cannot: callers skip
        its lookups, which under a full batch cost the engine time the batch needs.
        """
        return token_cost is None or self.weight(name) >= token_cost

    def observe(self, supported: dict[str, int], accepted: int) -> None:
        for name, n in supported.items():
            if n > 0:
                est = self.estimates.setdefault(name, AcceptanceEstimate())
                est.observe(n, min(accepted, n))
                if est.successes + est.failures > WEIGHT_WINDOW:
                    est.decay(0.5)

    def observe_outcome(self, name: str, matched: int, compared: int) -> None:
        """``name``'s chain was right for ``matched`` tokens of the ``compared`` the target has produced."""
        if compared > 0:
            self.observe({name: compared}, matched)


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
