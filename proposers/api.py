"""The proposer API's types: what passes between the adapter, a proposer, fusion and the policy.

Once per engine step the adapter (``freespec.vllm_plugins.adapter``) calls ``Proposer.draft(rows, step)``:
``rows`` are the batch's requests (``Row``) and ``step`` is a read-only ``StepContext`` (the policy's price of
one draft token, the step's time budget). The proposer returns one ``Draft`` per row (a ``Drafts`` when it
names the seconds of several sources); the policy (``freespec.scorers.policy``) cuts and sizes what comes back.
A source of a fusing plugin offers ``Candidates`` instead (``Proposer.candidates``; ``freespec.scorers.fusion``).

Plugins import these names from ``freespec.proposers.base``, which re-exports them (docs/proposer-api.md).
Plain data, numpy only: no vLLM, no freespec import.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

if TYPE_CHECKING:
    from freespec.scorers.calibration import TokenCalibration

# The proposer API's version: a minor release of freespec keeps every name of this module that a plugin
# uses working; a change that breaks one raises the major number, after a release that warns (docs/proposer-api.md).
API_VERSION = "1.0"


# The scope of every request without a ``cache_salt`` (and of all requests with ``"scope": "global"``).
SHARED_SCOPE = ""


@dataclass
class Row:
    """One request in this step's batch.

    ``key`` is stable for the life of a request (inferred, see
    ``request_tracker``); ``tokens`` is its whole sequence so far (prompt and
    output, read-only; on vLLM's V1 runner a view into a buffer whose row another request takes once this one
    finishes: valid only during the call, so copy what is kept, tests/test_row_views.py); ``num_new`` is how
    many tokens the last step appended
    (accepted drafts plus the bonus token; 0 during a partial prefill).
    ``scope`` (docs/security.md): a source that learns across requests drafts for this row only from requests
    of the same scope, and what it learns from this row serves only them; ``SHARED_SCOPE`` for requests without
    a ``cache_salt``; None: the row neither teaches nor is taught across requests. Stable for a request's life.
    """

    key: int
    tokens: np.ndarray
    num_new: int
    scope: Optional[str] = SHARED_SCOPE


@dataclass
class EngineInfo:
    """What a proposer may need to know about the model it drafts for (given once, by the adapter)."""

    vocab_size: int
    model: str = ""
    # Lazy: computing it loads the tokenizer, so only proposers with on-disk state ask for it.
    tokenizer_fingerprint: Optional[Callable[[], str]] = None
    # The operator's state directory (option ``state_dir``, ``proposers.learned.state_dir``): where a source that learns
    # across requests keeps its files; None: only its own per-source options, if any. Files older than
    # ``state_max_age_s`` are neither merged nor kept; one process's files of all scopes together take at most
    # ``state_max_bytes`` (``scoped_responses``).
    state_dir: Optional[str] = None
    state_max_age_s: float = 30 * 86_400.0
    state_max_bytes: int = 256_000_000


@dataclass
class ScoredPositions:
    """The target's top candidates at positions it scored in the last step (flat over the batch).

    ``tokens[i]`` is the token *at* scored position i (the input the target saw
    there); ``topk_ids[i]`` are the target's most likely next tokens after it,
    best first, and ``topk_probs[i]`` their probabilities (softmax at T=1).
    Rejected draft positions are included: their candidates are real target
    predictions too.
    """

    tokens: np.ndarray  # int32 [n]
    topk_ids: np.ndarray  # int32 [n, c]
    topk_probs: np.ndarray  # float32 [n, c]
    # the scope of the row each position belongs to (``Row.scope``); None: every position is SHARED_SCOPE's
    scopes: Optional[Sequence[Optional[str]]] = None


@dataclass(frozen=True)
class StepContext:
    """What the adapter tells a proposer about the step it drafts for (a new one every step; read-only).

    ``token_cost``: the load-aware policy's price of one draft token, in expected accepted tokens
    (``scorers.policy.GoodputPolicy.token_cost``): near 0 where verifying is almost free, near 1 under
    a full batch. None while the policy is off or has not measured enough; a proposer then uses its own
    fixed option (``bar``). A proposer may use it to choose what to offer (a tree path, whether a slow
    source is worth running); it need not cut its drafts by it: the policy cuts what is returned.
    ``budget_s``: seconds the whole ``draft`` call may take before the circuit breaker counts it as
    overrun. ``capture_seconds``: seconds the adapter spent in the last step copying the target's top-k
    for this proposer (0 without ``target_topk``).
    """

    token_cost: Optional[float] = None
    budget_s: float = math.inf
    capture_seconds: float = 0.0

    def bar(self, fixed: Optional[float]) -> Optional[float]:
        """The bar for one more draft token: the policy's price, else the proposer's fixed option."""
        return fixed if self.token_cost is None else self.token_cost


@dataclass
class Draft:
    """One row's draft: 0..k token ids, and what the proposer knows about them.

    ``chances[i]``: the chance that token i and every token before it are accepted, as the proposer
    estimates it (non-increasing); None when it does not estimate them. The policy cuts a draft where
    that chance falls below the step's bar, and with one request may drop or pad its last tokens for a
    faster step (``scorers.policy.shape_drafts``); without chances a draft is never cut, only padded.
    ``source``: which of the proposer's sources the draft came from (metrics by source); None: the
    plugin itself.
    """

    tokens: list[int]
    chances: Optional[list[float]] = None
    source: Optional[str] = None


class Drafts(list):
    """What ``draft`` may return in place of a plain list: the ``Draft`` per row, and the proposer's seconds
    per source in this call (``source_seconds``; metrics by source), for a proposer with several sources."""

    def __init__(self, drafts: Sequence[Draft] = (), source_seconds: Optional[dict[str, float]] = None) -> None:
        super().__init__(drafts)
        self.source_seconds: dict[str, float] = source_seconds if source_seconds is not None else {}


@dataclass
class Candidates:
    """One source's chains: ``chains[i, :]`` (-1 padded) with ``weights[i]`` (normalised per source).

    ``token_probs[i, d]``, when the source knows it, is the chance that chain i's token at depth d is
    accepted given the tokens before it were (``suffix``: learned per tree probability and match
    length); it then stands in for ``source_weight`` at that token. ``calibration``, when given instead,
    turns a token's share of the chains on the draft's path, at its depth, with ``match_len`` (the
    length of the context match that found the chains) into that chance.
    """

    name: str
    chains: np.ndarray  # int64 [n, L]
    weights: np.ndarray  # float64 [n]
    source_weight: float = 1.0
    token_probs: Optional[np.ndarray] = None  # float64 [n, L]
    calibration: Optional[TokenCalibration] = None
    match_len: int = 0

    @cached_property
    def descent(self) -> tuple[list[int], list[float]]:
        """``descend`` through the whole chains, worked out once: the source (to learn) and ``hybrid`` (to
        price it) both ask for it each step."""
        return descend(self, self.chains.shape[1])


def descend(s: Candidates, max_len: int) -> tuple[list[int], list[float]]:
    """What source ``s`` would draft alone, uncut: at each depth the token most of its chains on the path go on
    with (the smallest on a tie), and that token's share of them."""
    rows = [_unpadded(chain) for chain in s.chains[:, :max_len].tolist()]
    weights = s.weights.tolist()
    alive = [i for i, w in enumerate(weights) if w > 0]
    chain: list[int] = []
    shares: list[float] = []
    for depth in range(max_len):
        total = sum(weights[i] for i in alive)
        by_token: dict[int, float] = {}
        for i in alive:
            if depth < len(rows[i]):
                by_token[rows[i][depth]] = by_token.get(rows[i][depth], 0.0) + weights[i]
        if not by_token or total <= 0:
            break
        token, best = max(by_token.items(), key=lambda kv: (kv[1], -kv[0]))
        chain.append(token)
        shares.append(best / total)
        alive = [i for i in alive if depth < len(rows[i]) and rows[i][depth] == token]
    return chain, shares


def _unpadded(chain: list[int]) -> list[int]:
    return chain[: chain.index(-1)] if -1 in chain else chain
