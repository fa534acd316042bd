"""The ``retrieval`` proposer: draft from a datastore of earlier text (REST), fused with the request's own context (RASD).

Per step and request: the longest suffix of the context (``max_match`` down to ``min_match``
tokens) that occurs in the datastore (``search``: binary search in each shard's suffix
array, O(log n)); what followed a bounded, evenly spaced sample of its occurrences
(``max_continuations``); and, when ``fuse_copy`` is on, the ``copy`` proposer's chain from the
request's own prompt and output. ``scorers.fusion`` merges the chains by common prefix and
drafts the most supported one, cut where support falls below ``min_support`` (so a draft may be
short or empty). Source weights are the learned acceptance rates of each source's tokens.

Memory: a datastore of at most ``in_memory_mb`` (tokens and suffix arrays, 8 bytes per token)
is read into the drafting process's own memory, so a file changed in place under a running
server cannot harm it; a larger one is memory-mapped read-only (``datastore``), so it lives in
the page cache, shared by every worker on the host, and must be replaced only by rename
(docs/reliability.md); every step drops a mapped shard whose file changed size. Per request only
the copy proposer's state (see docs/copy.md) and the last draft's bookkeeping (its own chain: at most k
tokens).
"""
from __future__ import annotations

import logging
import os
from typing import Optional, Sequence

import numpy as np
from freespec.proposers.api import Draft, EngineInfo, Row, StepContext
from freespec.proposers.base import Proposer
from freespec.proposers.registry import CopySourceOptions, build_proposer
from freespec.proposers.retrieval.datastore import SEPARATOR, Datastore, read_manifest
from freespec.scorers.acceptance import matched_prefix
from freespec.scorers.calibration import TokenCalibration
from freespec.proposers.api import Candidates
from freespec.scorers.fusion import SourceWeights, fuse_sources
from pydantic import Field, field_validator, model_validator

logger = logging.getLogger("freespec")


class RetrievalOptions(CopySourceOptions):
    datastore: str = Field(..., description="datastore directory built by `freespec datastore build`")
    max_match: int = Field(16, ge=1, le=256, description="longest context suffix looked up")
    min_match: int = Field(2, ge=1, le=64, description="shortest context suffix that may match")
    max_continuations: int = Field(64, ge=1, le=4096, description="occurrences sampled per lookup")
    min_support: float = Field(0.2, ge=0.0, le=10.0, description="stop the draft where support falls below this")
    fuse_copy: bool = Field(True, description="also draft from the request's own context and fuse (RASD)")
    in_memory_mb: int = Field(
        1024, ge=0, le=1 << 20,
        description="a datastore up to this many MiB (8 bytes per token) is read into the drafting process's "
        "memory, safe from files changed in place; a larger one is memory-mapped (shared page cache: replace "
        "its files only by rename, docs/reliability.md). 0: always map",
    )

    @field_validator("datastore")
    @classmethod
    def _exists(cls, path: str) -> str:
        if not os.path.isdir(path):
            what = "is a file, not a datastore directory" if os.path.exists(path) else "does not exist"
            raise ValueError(f"datastore directory {path!r} {what}")
        read_manifest(path)  # a clear error now (format, version), before any worker starts
        return path

    @model_validator(mode="after")
    def _bounds(self) -> "RetrievalOptions":
        if self.max_match < self.min_match:
            raise ValueError(f"max_match ({self.max_match}) must be >= min_match ({self.min_match})")
        if self.copy is not None and not self.fuse_copy:
            raise ValueError('"copy" options are given but "fuse_copy" is off')
        return self


class RetrievalProposer(Proposer):
    Options = RetrievalOptions

    def __init__(self, options: RetrievalOptions, num_speculative_tokens: int) -> None:
        super().__init__(options, num_speculative_tokens)
        # The numba search kernels are imported with the proposer (in the worker), not with its options: a
        # process that only checks a config must not load numba (the package's docstring; in a process that
        # also runs the engine, vLLM 0.32's CPU kernel registration then fails on llvmlite's objects).
        from freespec.proposers.retrieval import search

        self._search = search
        self.store: Optional[Datastore] = None
        self.copy = build_proposer("copy", options.copy or {}, num_speculative_tokens) if options.fuse_copy \
            else None
        self.weights = SourceWeights()
        self.calibration = TokenCalibration()
        # key -> (sequence length when drafted, the draft as the policy keeps it, leading tokens each source
        # supported)
        self._supported: dict[int, tuple[int, list[int], dict[str, int]]] = {}
        self._chains: dict[int, tuple[int, list[int], list[int]]] = {}  # key -> (length then, own chain, cells)

    def bind(self, info: EngineInfo) -> None:
        fingerprint = info.tokenizer_fingerprint() if info.tokenizer_fingerprint else None
        self.store = Datastore.open(self.options.datastore, fingerprint, in_memory_bytes=self.options.in_memory_mb << 20)
        if not self.store.in_memory:
            logger.warning(
                "freespec: retrieval datastore %s (%d tokens) is above in_memory_mb=%d and is memory-mapped: "
                "replace its files only by rename (`freespec datastore build --force`); a file rewritten in place "
                "is dropped when seen, but one truncated between checks kills the process (docs/reliability.md)",
                self.options.datastore, self.store.total_tokens, self.options.in_memory_mb,
            )
        self.store.read_ahead()
        self._warm_up()
        if self.copy is not None:
            self.copy.bind(info)

    def _warm_up(self) -> None:
        """Load the numba search kernels now, at start, with one lookup of the datastore's own first tokens.

        Their first call loads (or compiles) them, which takes longer than many steps; on the engine's thread
        that would stall a step and make ``hybrid``'s pricing take the source for a slow one.
        """
        for shard in self.store.shards:
            if len(shard.sa) and len(shard.tokens) >= self.options.min_match:
                self.lookup(np.asarray(shard.tokens[: self.options.max_match]))
                return

    def check_files(self) -> None:
        """Before reading a mapped shard this step: drop those whose files were changed in place."""
        if self.store is not None and not self.store.in_memory:
            for name in self.store.check_files():
                logger.warning(
                    "freespec: retrieval datastore %s: shard %s changed in place under the server; it is dropped "
                    "(restart to serve the new files; replace datastores by rename, docs/reliability.md)",
                    self.options.datastore, name,
                )

    def lookup(self, context: np.ndarray) -> Optional[Candidates]:
        """Chains that followed the longest matching suffix of ``context`` in the datastore."""
        o = self.options
        tail = np.ascontiguousarray(context[-o.max_match :], dtype=np.uint32)
        found = []
        for shard in self.store.shards:
            if len(shard.sa):
                found.append((shard, *self._search.longest_match(np.asarray(shard.tokens), np.asarray(shard.sa), tail, o.min_match, o.max_match)))
        best = max((m for _, m, _, _ in found), default=0)
        if best == 0:
            return None
        parts = []
        total = sum(hi - lo for _, m, lo, hi in found if m == best)
        for shard, m, lo, hi in found:
            if m == best and hi > lo:
                # Each shard contributes samples in proportion to its occurrences.
                samples = max(1, round(o.max_continuations * (hi - lo) / total))
                parts.append(self._search.continuations(np.asarray(shard.tokens), np.asarray(shard.sa), lo, hi, m, self.k, samples, SEPARATOR))
        chains = np.concatenate(parts)
        return Candidates("retrieval", chains, np.ones(len(chains)), calibration=self.calibration, match_len=best)

    def _lookup_learning(self, row: Row) -> Optional[Candidates]:
        """``lookup`` for ``row``, first scoring its last chain against the tokens the target produced since (the
        calibration learns), then keeping the new one's chain to score at its next step."""
        last = self._chains.pop(row.key, None)
        if last is not None:
            start, chain, cells = last
            matched, compared = matched_prefix(chain, row.tokens[start : start + len(chain)].tolist())
            self.calibration.observe(cells, matched, compared)
        found = self.lookup(row.tokens)
        if found is not None:
            chain, shares = found.descent
            if chain:
                self._chains[row.key] = (len(row.tokens), chain, TokenCalibration.cells(shares, found.match_len))
        return found

    def draft(self, rows: Sequence[Row], step: StepContext) -> list[Draft]:
        if self.store is None:
            raise RuntimeError("retrieval proposer used before bind()")
        self.check_files()
        from_copy = self.copy.candidates(rows, step) if self.copy is not None else [None] * len(rows)
        ask_store = self.weights.can_pay("retrieval", step.token_cost)
        drafts: list[Draft] = []
        for row, copy_found in zip(rows, from_copy):
            last = self._supported.pop(row.key, None)
            if last is not None and row.num_new > 0:
                self._learn(row, *last)
            if row.num_new == 0 or len(row.tokens) < self.options.min_match:
                drafts.append(Draft([]))
                continue
            offered = {"retrieval": self._lookup_learning(row) if ask_store else None, "copy": copy_found}
            fused = fuse_sources(offered, self.weights, self.k, self.options.min_support, step.token_cost)
            if fused.paying:
                self._supported[row.key] = (len(row.tokens), fused.tokens[: fused.paying], fused.supported)
            drafts.append(Draft(fused.tokens, fused.chances))
        return drafts

    def _learn(self, row: Row, start: int, draft: list[int], supported: dict[str, int]) -> None:
        """Each source's supported tokens scored against what the target produced since: as far as it could
        be compared (the policy may have sent fewer tokens than were kept here)."""
        matched, compared = matched_prefix(draft, row.tokens[start : start + len(draft) + 1].tolist())
        for name, n in supported.items():
            n = min(n, compared)
            if n > 0:
                self.weights.observe({name: n}, matched)

    def candidates(self, rows: Sequence[Row], step: Optional[StepContext] = None) -> list[Optional[Candidates]]:
        """Every sampled continuation of each row's longest match (retrieval only), for ``hybrid``."""
        if self.copy is not None:  # fusing with its own copy source: offer the fused draft
            return super().candidates(rows, step)
        if self.store is None:
            raise RuntimeError("retrieval proposer used before bind()")
        self.check_files()
        return [self._lookup_learning(row) if row.num_new and len(row.tokens) >= self.options.min_match else None
                for row in rows]

    def release(self, key: int) -> None:
        self._supported.pop(key, None)
        self._chains.pop(key, None)
        if self.copy is not None:
            self.copy.release(key)

    def state_bytes(self) -> int:
        return self.copy.state_bytes() if self.copy is not None else 0
