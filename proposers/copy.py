"""The ``copy`` proposer: draft by copying what followed an earlier occurrence of the current suffix.

Follows prompt lookup decoding (Saxena, 2023) and CopySpec (Dumitru et al., 2025):
when the last tokens of a request already occurred earlier, the tokens that
followed them then are a good guess for what follows now. Two sources are searched:

- the request's own sequence (prompt and output so far), and
- a pool of recent outputs of requests that have left the batch, so a request
  that rewrites or re-sends an earlier answer (multi-turn chat, edits) can copy
  from it even when that answer is not in its own prompt. One pool per scope
  (``Row.scope``, docs/security.md): a request copies only from outputs of its own
  scope; a row without one (None) adds nothing and copies only from itself.

Each source keeps an index from every ``min_match``-gram to its most recent end
positions, updated incrementally, so a step costs the same at 2k and 32k tokens
of context. The longest match wins (ties: own sequence, then most recent); each
token of its continuation is offered with its chance of being accepted from an
online estimate of how often tokens of that source and match length are
(``freespec.scorers.acceptance``), learned by scoring every chain against what the
target produced next; the policy cuts the draft where that chance stops paying.

Memory (bounded): per live request, a copy of its tokens (4 B/token, bounded by
vLLM's ``max_model_len``) and its gram index (at most one entry per distinct gram,
each holding at most ``candidates_per_key`` positions); the indexes of all live
requests together cover at most ``max_live_indexed_tokens`` tokens (at most about
150 B each by ``state_bytes``, measured on 20,000 random tokens of a 49k-token
vocabulary: about 160 MB at the default); the pool holds at most ``pool_tokens`` tokens
plus their index, all scopes together (the least recently used scope's oldest
output goes first; an empty scope's pool is dropped). ``state_bytes()`` reports the current total; docs/copy.md
gives measured figures.
"""
from __future__ import annotations

import logging
import sys
from array import array
from collections import OrderedDict, deque
from typing import Sequence

from pydantic import Field, model_validator

from freespec.proposers.api import Draft, EngineInfo, Row, StepContext
from freespec.proposers.base import Proposer, ProposerOptions
from freespec.scorers.acceptance import AcceptanceEstimate, matched_prefix
from freespec.scorers.tuning import COPY_MATCH_BUCKETS, COPY_WINDOW

logger = logging.getLogger("freespec")

OWN, POOL = 0, 1  # draft sources


class CopyOptions(ProposerOptions):
    min_match: int = Field(2, ge=1, le=8, description="shortest suffix (tokens) that may match")
    max_match: int = Field(32, ge=1, le=256, description="longest suffix compared when ranking matches")
    candidates_per_key: int = Field(4, ge=1, le=64, description="recent occurrences kept per gram")
    pool_tokens: int = Field(
        262_144, ge=0, le=1 << 26, description="tokens of departed requests' outputs kept (0 = own context only)"
    )
    min_token_gain: float = Field(
        0.2,
        ge=0.0,
        le=1.0,
        description='draft one more token while its acceptance chance is at least this (with "policy": "fixed")',
    )
    adaptive: bool = Field(True, description="choose the length from acceptance estimates (False: draft up to k)")
    max_live_indexed_tokens: int = Field(
        1 << 20, ge=1024, le=1 << 26,
        description="tokens of live requests indexed at once, all requests together (at most about 150 B each); beyond it "
        "new tokens wait to be indexed until requests leave",
    )

    @model_validator(mode="after")
    def _match_bounds(self) -> "CopyOptions":
        if self.max_match < self.min_match:
            raise ValueError(f"max_match ({self.max_match}) must be >= min_match ({self.min_match})")
        return self


class _GramIndex:
    """gram (tuple of ``g`` tokens) -> recent end positions of that gram, newest last."""

    def __init__(self, g: int, per_key: int) -> None:
        self.g = g
        self.per_key = per_key
        self.table: dict[tuple[int, ...], list] = {}

    def add(self, seq: array, start: int, stop: int, tag=None) -> None:
        """Index the grams of ``seq`` that end at positions ``start..stop-1``."""
        g, per_key, table = self.g, self.per_key, self.table
        for end in range(max(start, g - 1), stop):
            key = tuple(seq[end - g + 1 : end + 1])
            entry = end if tag is None else (tag, end)
            slot = table.get(key)
            if slot is None:
                table[key] = [entry]
            else:
                slot.append(entry)
                if len(slot) > per_key:
                    del slot[0]

    def get(self, key: tuple[int, ...]) -> list:
        return self.table.get(key, [])

    def nbytes(self) -> int:
        n = sys.getsizeof(self.table)
        for key, slot in self.table.items():
            n += sys.getsizeof(key) + sys.getsizeof(slot)
        return n


class _Sequence:
    """What the proposer keeps for one live request."""

    __slots__ = ("seq", "indexed", "output_start", "index", "last_chain", "last_class", "scope")

    def __init__(self, g: int, per_key: int, output_start: int, scope: str | None) -> None:
        self.scope = scope  # whose pool it copies from and adds its output to (None: none)
        self.seq = array("i")
        self.indexed = 0  # grams ending before this position are in the index
        self.output_start = output_start
        self.index = _GramIndex(g, per_key)
        # the chain offered last step (whole, before the policy's cut) and its estimate class
        self.last_chain: list[int] = []
        self.last_class: tuple[int, int] | None = None


class _OutputPool:
    """Recent outputs of departed requests, bounded to ``capacity`` tokens."""

    def __init__(self, g: int, per_key: int, capacity: int) -> None:
        self.g, self.per_key, self.capacity = g, per_key, capacity
        self.segments: dict[int, array] = {}
        self.order: deque[int] = deque()
        self.tokens = 0
        self.evicted_since_rebuild = 0
        self.next_id = 0
        self.index = _GramIndex(g, per_key)

    def add(self, tokens: array) -> None:
        if self.capacity <= 0 or len(tokens) <= self.g:
            return
        if len(tokens) > self.capacity:
            tokens = tokens[-self.capacity :]
        seg_id = self.next_id
        self.next_id += 1
        self.segments[seg_id] = tokens
        self.order.append(seg_id)
        self.tokens += len(tokens)
        # Grams ending at the last position have no continuation: skip them.
        self.index.add(tokens, 0, len(tokens) - 1, tag=seg_id)
        while self.tokens > self.capacity:
            self.evict_oldest()

    def evict_oldest(self) -> int:
        """Drop the oldest output; the tokens it held."""
        old = self.segments.pop(self.order.popleft())
        self.tokens -= len(old)
        self.evicted_since_rebuild += len(old)
        if self.evicted_since_rebuild > self.capacity:
            self._rebuild()
        return len(old)

    def _rebuild(self) -> None:
        """Drop index entries of evicted segments (amortised: after ``capacity`` evicted tokens)."""
        self.index = _GramIndex(self.g, self.per_key)
        for seg_id in self.order:
            seg = self.segments[seg_id]
            self.index.add(seg, 0, len(seg) - 1, tag=seg_id)
        self.evicted_since_rebuild = 0

    def candidates(self, key: tuple[int, ...]):
        for seg_id, end in reversed(self.index.get(key)):
            seg = self.segments.get(seg_id)
            if seg is not None:
                yield seg, end

    def nbytes(self) -> int:
        return self.tokens * 4 + self.index.nbytes()


def _match_length(a: array, a_end: int, b: array, b_end: int, limit: int) -> int:
    """Number of equal tokens going backwards from ``a[a_end]`` and ``b[b_end]`` (at most ``limit``)."""
    m = 0
    limit = min(limit, a_end + 1, b_end + 1)
    while m < limit and a[a_end - m] == b[b_end - m]:
        m += 1
    return m


class CopyProposer(Proposer):
    Options = CopyOptions

    def __init__(self, options: CopyOptions, num_speculative_tokens: int) -> None:
        super().__init__(options, num_speculative_tokens)
        self.g = options.min_match
        self._seqs: dict[int, _Sequence] = {}
        self._live_indexed = 0  # tokens indexed in live requests' own indexes, all together
        # scope -> its pool of departed outputs, least recently used first; all together hold at most pool_tokens
        self._pools: OrderedDict[str, _OutputPool] = OrderedDict()
        self._pooled = 0  # tokens in all pools together
        self._estimates = [[AcceptanceEstimate(COPY_WINDOW) for _ in range(COPY_MATCH_BUCKETS)] for _ in (OWN, POOL)]
        self.persisted_by: str | None = None  # the source whose files fill the pool (hybrid's suffix), if any

    # -- lifecycle -------------------------------------------------------
    def bind(self, info: EngineInfo) -> None:
        # The pool alone is memory-only: with a state directory the operator expects learning to survive
        # restarts. In hybrid beside the suffix source it is filled from that source's files (``persisted_by``).
        if info.state_dir is not None and self.options.pool_tokens > 0 and self.persisted_by is None:
            logger.warning("freespec: copy keeps its pool of recent outputs in memory only, not in state_dir %s: "
                           "it starts empty after a restart and is not shared with replicas (hybrid's default "
                           "sources, suffix and recycle, keep their state there)", info.state_dir)

    def release(self, key: int) -> None:
        st = self._seqs.pop(key, None)
        if st is not None:
            self._live_indexed -= st.indexed
            if st.scope is not None:
                self.keep_output(st.scope, st.seq[st.output_start :])

    def keep_output(self, scope: str, tokens) -> None:
        """An output of ``scope`` enters its pool: a departed request's, or one loaded from a state directory
        (``SuffixTreeProposer.share_outputs``)."""
        if self.options.pool_tokens <= 0:
            return
        pool = self._pools.get(scope)
        if pool is None:
            pool = self._pools[scope] = _OutputPool(self.g, self.options.candidates_per_key, self.options.pool_tokens)
        self._pools.move_to_end(scope)
        before = pool.tokens
        pool.add(tokens if isinstance(tokens, array) else array("i", (int(t) for t in tokens)))
        self._pooled += pool.tokens - before
        if not pool.order:  # an output too short to keep
            del self._pools[scope]
        self._bound_pools()

    def forget_scope(self, scope: str) -> None:
        """A purged scope's pool goes (``freespec state purge --scope``)."""
        pool = self._pools.pop(scope, None)
        if pool is not None:
            self._pooled -= pool.tokens

    def _bound_pools(self) -> None:
        """At most ``pool_tokens`` in all scopes' pools together: the least recently used scope's oldest
        outputs go first; a pool left empty is dropped."""
        while self._pools and (self._pooled > self.options.pool_tokens or not next(iter(self._pools.values())).order):
            scope, pool = next(iter(self._pools.items()))  # the least recently used
            while self._pooled > self.options.pool_tokens and pool.order:
                self._pooled -= pool.evict_oldest()
            if not pool.order:
                del self._pools[scope]

    def state_bytes(self) -> int:
        live = sum(len(st.seq) * 4 + st.index.nbytes() for st in self._seqs.values())
        return live + sum(p.nbytes() for p in self._pools.values())

    # -- drafting --------------------------------------------------------
    def draft(self, rows: Sequence[Row], step: StepContext) -> list[Draft]:
        return [self._draft_one(row) for row in rows]

    def _draft_one(self, row: Row) -> Draft:
        n = len(row.tokens)
        st = self._seqs.get(row.key)
        if st is None:
            st = self._seqs[row.key] = _Sequence(self.g, self.options.candidates_per_key, n - row.num_new, row.scope)
        elif st.last_chain and row.num_new > 0:
            # Learn counterfactually: the step's new tokens are the target's own continuation, so the whole
            # chain is scored against them, however much of it the policy let through.
            self._learn(st.last_class, st.last_chain, row.tokens[n - row.num_new :].tolist())
        st.last_chain, st.last_class = [], None
        if len(st.seq) < n:
            st.seq.frombytes(row.tokens[len(st.seq) :].astype("int32", copy=False).tobytes())
        # Index every gram that ends before the last token (the last one is the query), within the budget
        # for live requests; what does not fit waits until requests leave.
        stop = min(n - 1, st.indexed + max(0, self.options.max_live_indexed_tokens - self._live_indexed))
        if stop > st.indexed:
            st.index.add(st.seq, st.indexed, stop)
            self._live_indexed += stop - st.indexed
            st.indexed = stop
        if row.num_new == 0 or n < self.g + 1:
            return Draft([])  # partial prefill: vLLM takes no draft for this row
        chain, cls = self._best_continuation(st, n)
        if not chain:
            return Draft([])
        st.last_chain, st.last_class = chain, cls
        if not self.options.adaptive:
            return Draft(chain)
        alpha = self._estimates[cls[0]][cls[1]].alpha
        return Draft(chain, [alpha ** (i + 1) for i in range(len(chain))])

    def fixed_bar(self) -> float | None:
        return self.options.min_token_gain if self.options.adaptive else None

    def _best_continuation(self, st: _Sequence, n: int) -> tuple[list[int], tuple[int, int]]:
        """Continuation (up to k tokens) of the longest earlier match of the suffix ending at n-1.

        Returns the draft and its estimate class (source, match-length bucket).
        """
        seq, g, k = st.seq, self.g, self.k
        key = tuple(seq[n - g : n])
        limit = self.options.max_match
        best_len, best_src, best_seq, best_end = 0, OWN, None, -1
        for end in reversed(st.index.get(key)):  # newest first: ties keep the most recent
            m = _match_length(seq, end, seq, n - 1, limit)
            if m > best_len:
                best_len, best_seq, best_end = m, seq, end
        pool = self._pools.get(st.scope) if st.scope is not None else None
        if pool is not None:
            self._pools.move_to_end(st.scope)
        for seg, end in (pool.candidates(key) if pool is not None else ()):
            m = _match_length(seg, end, seq, n - 1, limit)
            if m > best_len:  # strictly longer: own sequence wins ties
                best_len, best_src, best_seq, best_end = m, POOL, seg, end
        if best_seq is None:
            return [], (OWN, 0)
        stop = min(best_end + 1 + k, n if best_seq is seq else len(best_seq))
        bucket = min(best_len - g, COPY_MATCH_BUCKETS - 1)
        return best_seq[best_end + 1 : stop].tolist(), (best_src, bucket)

    def _learn(self, cls: tuple[int, int] | None, chain: list[int], produced: list[int]) -> None:
        if cls is None:
            return
        matched, compared = matched_prefix(chain, produced)
        self._estimates[cls[0]][cls[1]].observe(compared, matched)
