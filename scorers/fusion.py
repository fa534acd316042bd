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

from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import numpy as np
from freespec.scorers.acceptance import AcceptanceEstimate
from freespec.proposers.api import Candidates, Draft
from freespec.scorers.policy import cut
from freespec.scorers.tuning import WEIGHT_WINDOW


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
        return self.estimates.setdefault(name, AcceptanceEstimate(WEIGHT_WINDOW)).alpha

    def can_pay(self, name: str, token_cost: Optional[float]) -> bool:
        """Whether ``name``'s drafts can clear the policy's bar on their own (always, with fixed bars).

        A source whose tokens are accepted less often than one draft token costs cannot: callers skip
        its lookups, which under a full batch cost the engine time the batch needs.
        """
        return token_cost is None or self.weight(name) >= token_cost

    def observe(self, supported: dict[str, int], accepted: int) -> None:
        for name, n in supported.items():
            if n > 0:
                self.estimates.setdefault(name, AcceptanceEstimate(WEIGHT_WINDOW)).observe(n, min(accepted, n))

    def observe_outcome(self, name: str, matched: int, compared: int) -> None:
        """``name``'s chain was right for ``matched`` tokens of the ``compared`` the target has produced."""
        if compared > 0:
            self.observe({name: compared}, matched)
