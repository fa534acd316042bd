"""Per-request draft state of the ``pearl`` proposer, and the loop that drives a draft model (no torch).

vLLM calls the proposer once per step with each request's whole sequence and
verifies the linear chain it gets back. Between two calls the draft model is
free; PEARL's post-verify uses that time: right after a chain is returned, the
draft keeps going past the chain's end as if the target will accept all of it,
and predicts the target's bonus token too. At the next step either

- the target took the whole chain and its bonus token is the one the draft
  predicted: the next chain is already drafted (a *hit*), or
- it rejected at some position, or picked another bonus token: everything
  drafted after the first wrong token is discarded, the draft model's KV cache
  is cut back to the tokens the target kept, and drafting resumes from there.

One request's state (``RequestDraft``) is the sequence the draft model
believes in: the context the target produced (as of the last step) followed by
the draft's own predictions, and how much of that sequence is in the draft's
KV cache (``kv_len``). The draft model predicts greedily: the prediction at
position p is the draft's argmax given everything before p, and is kept with
its probability (the draft's confidence). Invariant: ``kv_len < len(sequence)``
whenever the sequence is not empty; feeding ``sequence[kv_len:]`` to the draft
model yields the prediction for the next position.

Draft length adapts per request, bounded by k:

- confidence: a chain stops before the first prediction whose draft
  probability is below ``min_confidence`` (that prediction is then the draft's
  guess of the target's bonus token, which post-verify extends from);
- acceptance: a per-request budget grows by 2 after a fully accepted chain and
  shrinks by 1 after a rejection (the heuristic of transformers' assisted
  generation), between 1 and k.

``PearlDrafter`` runs the state machine over a batch against any
``DraftBackend`` (the torch one is ``draft.TorchDraftModel``; the tests
use a scripted one): ``step(rows)`` is the synchronous part of a vLLM step,
``extend(should_stop)`` the post-verify work done while vLLM verifies. It also
keeps the draft's KV memory within bounds (requests and tokens, least recently
used first) and counts what happened (``stats``).
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

import numpy as np

from freespec.proposers.api import Draft, Row
from freespec.scorers.fusion import prefix_chances
from freespec.scorers.policy import cut
from freespec.scorers.tuning import PEARL_BUDGET_GROW, PEARL_BUDGET_SHRINK


@dataclass
class Feed:
    """Tokens to append to one request's draft KV cache, which holds exactly ``start`` tokens first."""

    key: int
    start: int
    tokens: list[int]


class DraftBackend(Protocol):
    """What ``PearlDrafter`` needs from a draft model that keeps one KV cache per request."""

    def forward(self, feeds: Sequence[Feed]) -> list[tuple[int, float]]:
        """Append each feed's tokens to its request's cache (cut first to ``start`` tokens).

        Returns, per feed, the draft's most likely next token after the last fed token and its probability.
        """

    def truncate(self, key: int, length: int) -> None:
        """Cut ``key``'s cache to its first ``length`` tokens (no-op if it holds fewer)."""

    def drop(self, key: int) -> None:
        """Forget ``key``'s cache."""


@dataclass
class DrafterStats:
    """What the drafter did; the quantities PEARL is about (served from post-verify vs drafted on demand)."""

    steps: int = 0
    rows: int = 0
    chains: int = 0
    chain_tokens: int = 0
    hits: int = 0  # rows whose whole chain was drafted before the step (post-verify hit)
    partial: int = 0  # rows that reused post-verify predictions but drafted more in the step
    misses: int = 0  # rows whose predictions the target contradicted (a rejection, or another bonus token)
    rolled_back_tokens: int = 0  # KV tokens discarded because of misses
    deferred: int = 0  # rows too far behind the context: no chain, caught up in the background
    refused: int = 0  # rows beyond the memory bounds or the draft's position limit: no chain
    evictions: int = 0
    sync_forwards: int = 0  # draft forward passes the target waited for
    background_forwards: int = 0  # forward passes done while the target was busy
    policy_cut_tokens: int = 0  # chain tokens left out because the load-aware bar said they do not pay

    def as_dict(self) -> dict:
        return dict(vars(self))


class RequestDraft:
    """What the draft model believes about one request; see the module docstring."""

    __slots__ = ("context", "preds", "confs", "kv_len", "budget", "last_chain", "extend_from")

    def __init__(self, budget: int) -> None:
        self.context = np.zeros(0, dtype=np.int32)  # tokens the target produced, as of the last step
        self.preds: list[int] = []  # draft predictions for positions len(context), len(context)+1, ...
        self.confs: list[float] = []  # the draft's probability of each prediction
        self.kv_len = 0  # sequence[:kv_len] is in the draft model's KV cache
        self.budget = budget  # adaptive chain length (1..k)
        self.last_chain = 0  # length of the chain returned at the last step
        self.extend_from: Optional[int] = None  # where the chain post-verify drafts for starts; None: nothing to extend

    # -- the sequence ---------------------------------------------------------
    def __len__(self) -> int:
        return len(self.context) + len(self.preds)

    def tokens_from(self, start: int) -> list[int]:
        """``sequence[start:]`` as Python ints (context part included when ``start`` is inside it)."""
        n = len(self.context)
        head = self.context[start:].tolist() if start < n else []
        return head + self.preds[max(0, start - n) :]

    def confidences(self, start: int, n: int) -> list[float]:
        """The draft's probability of each of the ``n`` predictions from position ``start``."""
        off = start - len(self.context)
        return self.confs[off : off + n]

    def record(self, token: int, conf: float) -> None:
        """The draft's prediction after feeding ``sequence[kv_len:]``: the cache now holds the whole sequence."""
        self.kv_len = len(self)
        self.preds.append(int(token))
        self.confs.append(float(conf))

    def pending_feed(self) -> list[int]:
        """Tokens the draft model must be fed to predict the next position."""
        return self.tokens_from(self.kv_len)

    # -- one engine step ------------------------------------------------------
    def learn(self, num_new: int, k: int, adaptive: bool) -> None:
        """Adapt the budget to how much of the last chain the target accepted (``num_new - 1`` tokens)."""
        if not adaptive:
            self.budget = k
        elif self.last_chain > 0:
            if num_new - 1 >= self.last_chain:
                self.budget = min(k, self.budget + PEARL_BUDGET_GROW)
            else:
                self.budget = max(1, self.budget - PEARL_BUDGET_SHRINK)
        self.last_chain = 0

    def reconcile(self, tokens: np.ndarray) -> tuple[bool, bool, int]:
        """Take the target's new context; keep the predictions it confirms, roll back the rest.

        Returns ``(kept, contradicted, rolled_back)``: whether predictions beyond the new
        context survive (the target took what the draft expected), whether the target
        produced another token than a prediction (a rejected draft token or another
        bonus token), and how many KV tokens were discarded.
        """
        n_new, n_old = len(tokens), len(self.context)
        old_len = len(self)
        # Longest common prefix of the believed sequence and the new context.
        common = min(n_old, n_new)
        diff = np.flatnonzero(self.context[:common] != tokens[:common])
        m = int(diff[0]) if len(diff) else common
        if m == n_old:
            for j, tok in enumerate(self.preds[: n_new - n_old]):
                if int(tokens[n_old + j]) != tok:
                    break
                m += 1
        if m == n_new and old_len > n_new:
            # The new context is a prefix of what the draft believed: the predictions
            # after it were made from exactly this context and stay valid.
            cut = n_new - n_old
            self.preds, self.confs = self.preds[cut:], self.confs[cut:]
            self.context = np.array(tokens, dtype=np.int32)
            return True, False, 0
        contradicted = m < min(old_len, n_new)
        # Keep the cache only for tokens the target agrees with, and leave at least
        # the last context token to feed (its prediction is the next draft token).
        keep = min(self.kv_len, m, n_new - 1)
        rolled = self.kv_len - keep
        self.kv_len = max(0, keep)
        self.context = np.array(tokens, dtype=np.int32)
        self.preds, self.confs = [], []
        return False, contradicted, rolled

    def chain(self, start: int, budget: int, min_conf: float) -> tuple[list[int], bool]:
        """The chain drafted from position ``start``, and whether it is decided.

        It takes predictions while their confidence is at least ``min_conf``, at most
        ``budget``; it is undecided while it could still grow from predictions not made yet.
        """
        off = start - len(self.context)
        if off < 0:
            return [], False
        for j in range(budget):
            i = off + j
            if i >= len(self.preds):
                return self.preds[off:i], False
            if self.confs[i] < min_conf:
                return self.preds[off:i], True
        return self.preds[off : off + budget], True


# Post-verify extends a chain of length L into: the predicted bonus token, then the next chain.
def next_budget(st: RequestDraft, k: int, adaptive: bool) -> int:
    """The budget the request will have if the target accepts its whole current chain."""
    if not adaptive:
        return k
    return min(k, st.budget + PEARL_BUDGET_GROW) if st.last_chain > 0 else st.budget


class PearlDrafter:
    """Drives a ``DraftBackend`` for every live request: synchronous steps, post-verify between them.

    Not thread-safe except ``release``: one thread (``draft.DraftWorker``) calls
    ``step`` and ``extend``; ``release`` may come from any thread.
    """

    def __init__(
        self,
        backend: DraftBackend,
        k: int,
        *,
        min_confidence: float = 0.0,
        adaptive_length: bool = True,
        max_requests: int = 64,
        max_cached_tokens: int = 1 << 20,
        sync_feed_tokens: int = 16,
        prefill_chunk: int = 32,
        max_position: int = 1 << 30,
    ) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.backend = backend
        self.k = k
        self.min_confidence = min_confidence
        self.adaptive = adaptive_length
        self.max_requests = max_requests
        self.max_cached_tokens = max_cached_tokens
        self.sync_feed_tokens = max(1, sync_feed_tokens)
        self.prefill_chunk = max(1, prefill_chunk)
        self.max_position = max_position
        self.states: OrderedDict[int, RequestDraft] = OrderedDict()  # least recently used first
        self.stats = DrafterStats()
        self._released: deque[int] = deque()  # thread-safe appends from release()
        self._last_keys: list[int] = []  # this step's requests, in row order (post-verify works on them)

    # -- memory ---------------------------------------------------------------
    # Most tokens a request's cache can hold during a step and its post-verify:
    # the context, a chain (<= k), the bonus prediction, the next chain (<= k).
    def _peak_tokens(self, n: int) -> int:
        return n + 2 * self.k + 1

    def cached_tokens(self) -> int:
        return sum(st.kv_len for st in self.states.values())

    def release(self, key: int) -> None:
        """The request left the batch; its cache is freed at the drafter's next step or forward."""
        self._released.append(key)

    def _drain_released(self) -> None:
        while self._released:
            key = self._released.popleft()
            if self.states.pop(key, None) is not None:
                self.backend.drop(key)

    def _forget(self, key: int) -> None:
        self.states.pop(key, None)
        self.backend.drop(key)

    def reset(self) -> None:
        """Drop every request's state (after an error that may have left caches inconsistent)."""
        for key in list(self.states):
            self._forget(key)
        self._last_keys = []

    def _admit(self, rows: Sequence[Row]) -> set[int]:
        """Which of this step's requests may hold a cache; evict others (LRU) to make room.

        Requests are admitted in row order while their peak size fits; requests
        not in this step are evicted least recently used first.
        """
        admitted: set[int] = set()
        tokens = 0
        for row in rows:
            if row.num_new == 0 or row.key in admitted:
                continue
            need = self._peak_tokens(len(row.tokens))
            if need > self.max_position or len(admitted) >= self.max_requests or tokens + need > self.max_cached_tokens:
                continue
            admitted.add(row.key)
            tokens += need
        drafting = {row.key for row in rows if row.num_new}  # partial-prefill rows hold nothing worth keeping
        others = [key for key in self.states if key not in drafting]
        held = len(admitted) + len(others)
        held_tokens = tokens + sum(self.states[key].kv_len for key in others)
        for key in others:  # least recently used first
            if held <= self.max_requests and held_tokens <= self.max_cached_tokens:
                break
            held -= 1
            held_tokens -= self.states[key].kv_len
            self._forget(key)
            self.stats.evictions += 1
        return admitted

    # -- the synchronous step --------------------------------------------------
    def step(self, rows: Sequence[Row], token_cost: Optional[float] = None,
             sync_feed_tokens: Optional[int] = None) -> list[list[int]]:
        """One chain (0..k tokens) per row, drafting now only what post-verify has not.

        ``token_cost``: the load-aware bar (scorers/policy.py). A chain is cut where the product
        of the draft's confidences (its estimate that the prefix is accepted) falls below it;
        None leaves chains to ``min_confidence`` and the budget alone. ``sync_feed_tokens``: this
        step's limit when lower than the option's (rows further behind are caught up in the background).
        """
        sync_limit = self.sync_feed_tokens
        if sync_feed_tokens is not None:
            sync_limit = min(sync_limit, max(1, int(sync_feed_tokens)))
        self._drain_released()
        s = self.stats
        s.steps += 1
        s.rows += len(rows)
        admitted = self._admit(rows)
        chains: list[list[int]] = [[] for _ in rows]
        todo: list[tuple[int, RequestDraft]] = []
        self._last_keys = []
        for i, row in enumerate(rows):
            if row.num_new == 0:
                continue  # partial prefill: vLLM takes no draft for this row
            if row.key not in admitted:
                if row.key in self.states:
                    self._forget(row.key)
                s.refused += 1
                continue
            st = self.states.get(row.key)
            if st is None:
                st = self.states[row.key] = RequestDraft(self.k)
            self.states.move_to_end(row.key)
            st.learn(row.num_new, self.k, self.adaptive)
            kept, contradicted, rolled = st.reconcile(row.tokens)
            if rolled:
                self.backend.truncate(row.key, st.kv_len)
                s.rolled_back_tokens += rolled
            s.misses += contradicted
            st.extend_from = None
            self._last_keys.append(row.key)
            chain, decided = st.chain(len(st.context), st.budget, self.min_confidence)
            if decided:
                chains[i] = chain
                s.hits += 1
            elif len(st.pending_feed()) > sync_limit:
                s.deferred += 1  # caught up by extend(); no chain this step
            else:
                if kept:
                    s.partial += 1
                todo.append((i, st))
        # Draft what is missing, one batched forward per position.
        active = todo
        while active:
            keys = [rows[i].key for i, _ in active]
            self._forward([(key, st) for key, (_, st) in zip(keys, active)])
            s.sync_forwards += 1
            still = []
            for i, st in active:
                chain, decided = st.chain(len(st.context), st.budget, self.min_confidence)
                if decided:
                    chains[i] = chain
                else:
                    still.append((i, st))
            active = still
        for i, row in enumerate(rows):
            st = self.states.get(row.key) if row.num_new else None
            if st is not None and row.key in admitted and (chains[i] or st.preds):
                if token_cost is not None and chains[i]:
                    keep = len(cut(Draft(chains[i], prefix_chances(st.confidences(len(st.context), len(chains[i])))),
                                   token_cost).tokens)
                    s.policy_cut_tokens += len(chains[i]) - keep
                    chains[i] = chains[i][:keep]
                st.last_chain = len(chains[i])
                # Post-verify: if the target takes the whole chain, the next chain starts
                # after it and the bonus token (the prediction right after the chain).
                st.extend_from = len(st.context) + len(chains[i]) + 1
        s.chains += sum(1 for c in chains if c)
        s.chain_tokens += sum(len(c) for c in chains)
        return chains

    def _forward(self, batch: list[tuple[int, RequestDraft]]) -> None:
        feeds = [Feed(key, st.kv_len, st.pending_feed()) for key, st in batch]
        for (key, st), (token, conf) in zip(batch, self.backend.forward(feeds)):
            st.record(token, conf)

    # -- post-verify (between steps) -------------------------------------------
    def extend(self, should_stop: Callable[[], bool] = lambda: False) -> bool:
        """Draft ahead while vLLM verifies; stop after the current forward once ``should_stop()``.

        First, for every request of the last step, the chain that follows its current
        chain and predicted bonus token (batched, one position per forward); then, one
        request at a time in chunks of ``prefill_chunk`` tokens, requests whose cache
        was too far behind to draft in the step (new prompts, evicted caches), which
        are then extended too. Returns True when everything there was to do is done.
        """
        while not should_stop():
            self._drain_released()
            batch = []
            behind = None
            for key in self._last_keys:
                st = self.states.get(key)
                if st is None:
                    continue
                if st.extend_from is None:
                    behind = behind or (key, st)
                    continue
                _, decided = st.chain(st.extend_from, next_budget(st, self.k, self.adaptive), self.min_confidence)
                if not decided:
                    batch.append((key, st))
            if batch:
                self._forward(batch)
            elif behind is not None:
                self._catch_up(*behind)
            else:
                return True
            self.stats.background_forwards += 1
        return False

    def _catch_up(self, key: int, st: RequestDraft) -> None:
        """Feed one chunk of a request the draft is behind on; once level, extend it like the others."""
        feed = st.pending_feed()
        if len(feed) > self.prefill_chunk:
            self.backend.forward([Feed(key, st.kv_len, feed[: self.prefill_chunk])])
            st.kv_len += self.prefill_chunk  # the prediction after a partial prefix is of no use
            return
        self._forward([(key, st)])
        # It drafted no chain this step: if the target's next token is the one just
        # predicted, the next chain starts right after it.
        st.last_chain = 0
        st.extend_from = len(st.context) + 1

    def __len__(self) -> int:
        return len(self.states)
