"""The ``hybrid`` proposer: every source proposes, one fused chain per request is drafted.

Sources: ``copy`` (the request's own context and recent outputs), ``recycle`` (the target's own
top-k from earlier steps) and ``retrieval`` (a datastore; needs the ``datastore`` option). Each
source offers its candidates (``Proposer.candidates``): ``copy`` and ``recycle`` their one chain,
drafted with the same load-aware bar (``token_cost``, scorers/policy.py), ``retrieval`` every
sampled continuation of its longest match. They are fused by common prefix exactly as the
``retrieval`` plugin fuses its two sources (``scorers.fusion``): a token's support is the sum over
sources of the source's learned per-token acceptance rate times the share of its candidates that
agree up to it; the draft follows the best-supported token while that support is at least
``min_support`` and, with the goodput policy, while the chance that the whole prefix is accepted
pays for verifying it. So a request gets copy drafts while it rewrites, datastore drafts while it
answers from known material, recycled drafts otherwise, and agreement between sources makes a
draft longer.

Memory: the sum of the sources' (see their docs). Known simplification: each source learns its
own acceptance estimates from how many drafted tokens were accepted, also on steps where the
fused draft was not its chain.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
from pydantic import Field, field_validator, model_validator

from freespec.proposers.base import EngineInfo, Proposer, ProposerOptions, Row, ScoredPositions
from freespec.scorers.fusion import SourceWeights, fuse, paying_prefix

SOURCES = ("copy", "recycle", "retrieval")


class HybridOptions(ProposerOptions):
    sources: tuple[str, ...] = Field(("copy", "recycle"), min_length=1, description=f"any of {list(SOURCES)}")
    datastore: Optional[str] = Field(None, description="datastore directory, for the retrieval source")
    min_support: float = Field(0.2, ge=0.0, le=10.0, description="stop the draft where support falls below this")

    @field_validator("sources")
    @classmethod
    def _known(cls, sources: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [s for s in sources if s not in SOURCES]
        if unknown or len(set(sources)) != len(sources):
            raise ValueError(f"sources must be distinct names among {list(SOURCES)}, got {list(sources)}")
        return sources

    @model_validator(mode="after")
    def _datastore_for_retrieval(self) -> "HybridOptions":
        if "retrieval" in self.sources and self.datastore is None:
            raise ValueError('the "retrieval" source needs the "datastore" option')
        if self.datastore is not None and "retrieval" not in self.sources:
            raise ValueError('"datastore" is given but "retrieval" is not among the sources')
        return self


def _make_source(name: str, options: HybridOptions, k: int) -> Proposer:
    if name == "copy":
        from freespec.proposers.copy import CopyOptions, CopyProposer

        return CopyProposer(CopyOptions(), k)
    if name == "recycle":
        from freespec.proposers.recycle import RecycleOptions, RecycleProposer

        return RecycleProposer(RecycleOptions(), k)
    from freespec.proposers.retrieval import RetrievalOptions, RetrievalProposer

    return RetrievalProposer(RetrievalOptions(datastore=options.datastore, fuse_copy=False), k)


class HybridProposer(Proposer):
    Options = HybridOptions
    target_topk = 8  # when recycle is a source (set per instance)

    def __init__(self, options: HybridOptions, num_speculative_tokens: int) -> None:
        super().__init__(options, num_speculative_tokens)
        self.sources = {name: _make_source(name, options, num_speculative_tokens) for name in options.sources}
        self.target_topk = max((s.target_topk for s in self.sources.values()), default=0)
        self.weights = SourceWeights()
        self._supported: dict[int, dict[str, int]] = {}

    def bind(self, info: EngineInfo) -> None:
        for source in self.sources.values():
            source.bind(info)

    def observe(self, scored: ScoredPositions) -> None:
        for source in self.sources.values():
            if source.target_topk:
                source.observe(scored)

    def wants_target_topk(self) -> bool:
        # Only recycle learns from the target's top-k; while it cannot pay it is not asked to draft.
        return "recycle" in self.sources and self.weights.can_pay("recycle", self.token_cost)

    def propose(self, rows: Sequence[Row]) -> list[list[int]]:
        offered = {}
        for name, source in self.sources.items():
            if not self.weights.can_pay(name, self.token_cost):
                offered[name] = [None] * len(rows)
                continue
            source.token_cost = self.token_cost
            offered[name] = source.candidates(rows)
        drafts = []
        for i, row in enumerate(rows):
            supported = self._supported.pop(row.key, None)
            if supported is not None and row.num_new > 0:
                self.weights.observe(supported, row.num_new - 1)
            candidates = []
            for name in self.sources:
                found = offered[name][i]
                if found is not None:
                    found.name, found.source_weight = name, self.weights.weight(name)
                    candidates.append(found)
            draft, support, supported = fuse(candidates, self.k, self.options.min_support)
            if self.token_cost is not None:
                draft = draft[: paying_prefix(support, self.token_cost)]
            if draft:
                self._supported[row.key] = {name: min(n, len(draft)) for name, n in supported.items()}
            drafts.append(draft)
        return drafts

    def release(self, key: int) -> None:
        self._supported.pop(key, None)
        for source in self.sources.values():
            source.release(key)

    def state_bytes(self) -> int:
        return sum(source.state_bytes() for source in self.sources.values())
