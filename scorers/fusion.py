"""Fuse candidate chains from several sources into one draft by longest common prefix (RASD-style).

Each source offers chains (token sequences) with a weight per chain. Chains that share a
prefix support it together: the support of a prefix is the sum, over sources, of the
source's weight times the fraction of that source's chain weight that continues with that
prefix. The draft descends from the empty prefix, at each depth taking the next token with
the largest support, and stops when the best support falls below ``min_support`` (so it
may be empty). With retrieval alone (weight 1) this is REST's choice: follow the
continuation most occurrences agree on, while enough of them agree. A request's own
context (the ``copy`` proposer's chain) adds its weight along its chain, so where the
datastore and the context agree the draft is confident, and where only one source knows
something, that source decides.

Source weights are learned (``SourceWeights``): the acceptance rate of tokens each source
supported, so a source that is often wrong for this workload counts for less.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from freespec.scorers.acceptance import AcceptanceEstimate


@dataclass
class Candidates:
    """One source's chains: ``chains[i, :]`` (-1 padded) with ``weights[i]`` (normalised per source)."""

    name: str
    chains: np.ndarray  # int64 [n, L]
    weights: np.ndarray  # float64 [n]
    source_weight: float = 1.0


def fuse(sources: list[Candidates], max_len: int, min_support: float) -> tuple[list[int], list[float], dict[str, int]]:
    """(draft, support of each draft token, how many leading draft tokens each source supported)."""
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
            if depth >= s.chains.shape[1]:
                continue
            col = s.chains[mask, depth]
            ww = w[mask]
            for token, weight in zip(col.tolist(), ww.tolist()):
                if token >= 0:
                    scores[token] = scores.get(token, 0.0) + s.source_weight * weight
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


def paying_prefix(support: list[float], token_cost: float) -> int:
    """Tokens of a fused draft worth verifying: while the chance the prefix is accepted (the product of
    per-token supports, each capped at 1) is at least the policy's per-token cost."""
    p, n = 1.0, 0
    for s in support:
        p *= min(1.0, s)
        if p < token_cost:
            break
        n += 1
    return n


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
                if est.successes + est.failures > 4000:
                    est.decay(0.5)
