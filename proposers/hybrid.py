"""The ``hybrid`` proposer: every source proposes, one fused chain per request is drafted.

Sources: ``copy`` (the request's own context and recent outputs), ``recycle`` (the target's own
top-k from earlier steps) and ``retrieval`` (a datastore; needs the ``datastore`` option). Each
source drafts its own chain with the same load-aware bar (``token_cost``, scorers/policy.py).
The chains are merged by common prefix (``scorers.fusion``): a token's support is the sum of the
learned per-token acceptance rates of the sources whose chains agree up to it, and the draft is
cut where the chance that the whole prefix is accepted (the product of supports, capped at 1)
falls below the bar, so a request gets copy drafts while it rewrites, datastore drafts while it
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
from freespec.scorers.fusion import Candidates, SourceWeights, fuse, paying_prefix

SOURCES = ("copy", "recycle", "retrieval")
DEFAULT_BAR = 0.2  # with "policy": "fixed": a prefix is drafted while its acceptance chance is at least this


class HybridOptions(ProposerOptions):
    sources: tuple[str, ...] = Field(("copy", "recycle"), min_length=1, description=f"any of {list(SOURCES)}")
    datastore: Optional[str] = Field(None, description="datastore directory, for the retrieval source")
    min_token_gain: float = Field(
        DEFAULT_BAR, ge=0.0, le=1.0, description='bar for one more draft token with "policy": "fixed"'
    )

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

    def propose(self, rows: Sequence[Row]) -> list[list[int]]:
        chains = {}
        for name, source in self.sources.items():
            source.token_cost = self.token_cost
            chains[name] = source.propose(rows)
        bar = self.gain_threshold(self.options.min_token_gain)
        drafts = []
        for i, row in enumerate(rows):
            supported = self._supported.pop(row.key, None)
            if supported is not None and row.num_new > 0:
                self.weights.observe(supported, row.num_new - 1)
            candidates = [
                Candidates(name, np.asarray([chains[name][i]], dtype=np.int64), np.ones(1), self.weights.weight(name))
                for name in self.sources
                if chains[name][i]
            ]
            draft, support, supported = fuse(candidates, self.k, 0.0)
            draft = draft[: paying_prefix(support, bar)]
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
