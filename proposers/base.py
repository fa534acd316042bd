"""The proposer API: what a freespec proposer receives each step, what it returns, and what it may keep.

This module is all a plugin imports (docs/proposer-api.md). Once per engine step the adapter
(``freespec.vllm_plugins.adapter``) calls ``Proposer.draft(rows, step)``: ``rows`` are the batch's
requests (``Row``: a stable key, the whole token sequence, the tokens the last step appended) and
``step`` is a ``StepContext`` (the policy's price of one draft token, the step's time budget). It
returns one ``Draft`` per row: its tokens, where the proposer estimates them the chance of each being
accepted, and the source it came from. The adapter sets nothing on a proposer and asks nothing about
the last call; the goodput cut and the step sizing are applied once, by the policy, to what comes back
(``freespec.scorers.policy``).

Proposers are engine-agnostic: numpy arrays of token ids in, lists of token ids out; no vLLM import.
"""
from __future__ import annotations

from abc import ABC
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar, Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

from freespec.option_checks import refuse_string_numbers

logger = logging.getLogger("freespec")

# The proposer API's version: a minor release of freespec keeps every name of this module that a plugin
# uses working; a change that breaks one raises the major number, after a release that warns (docs/proposer-api.md).
API_VERSION = "1.0"

if TYPE_CHECKING:
    from freespec.scorers.fusion import Candidates


class ProposerOptions(BaseModel):
    """Base of every plugin's options: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _one_coercion_rule(cls, data):
        """Strings are never converted to numbers (``freespec.option_checks``): one rule for every option."""
        return refuse_string_numbers(cls, data)


@dataclass
class Row:
    """One request in this step's batch.

    ``key`` is stable for the life of a request (inferred, see
    ``request_tracker``); ``tokens`` is its whole sequence so far (prompt and
    output, read-only); ``num_new`` is how many tokens the last step appended
    (accepted drafts plus the bonus token; 0 during a partial prefill).
    """

    key: int
    tokens: np.ndarray
    num_new: int


@dataclass
class EngineInfo:
    """What a proposer may need to know about the model it drafts for (given once, by the adapter)."""

    vocab_size: int
    model: str = ""
    # Lazy: computing it loads the tokenizer, so only proposers with on-disk state ask for it.
    tokenizer_fingerprint: Optional[Callable[[], str]] = None


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


class Proposer(ABC):
    """A drafting algorithm. Subclasses set ``Options`` and implement ``draft``.

    What a proposer may keep between steps: anything keyed by ``Row.key`` until ``release(key)``, and
    what it learns across requests, each bounded by its options (``state_bytes`` reports it). What it
    must bound: memory, by its options; time, ``draft`` well inside ``StepContext.budget_s`` (a slow or
    raising proposer drafts nothing for that step, and the circuit breaker switches it off for a while).
    """

    Options: ClassVar[type[ProposerOptions]] = ProposerOptions
    # > 0: the proposer wants the target's top-``target_topk`` candidates at every scored
    # position, delivered through ``observe`` before each ``draft``.
    target_topk: int = 0  # instances may set it from their options
    # True: the plugin weighs its own drafting time itself (``hybrid``'s source pricing), so the load-aware
    # policy fits the target's step time without it. Otherwise a slow source (a draft model's chain) is
    # counted in the price of every verified token, twice over with the pricing.
    prices_own_time: bool = False
    # Deprecated (API 0): the bar as the adapter set it before each step; read only by proposers that
    # still implement ``propose`` alone (see ``draft``).
    token_cost: Optional[float] = None

    def __init__(self, options: ProposerOptions, num_speculative_tokens: int) -> None:
        self.options = options
        self.k = num_speculative_tokens

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # Written against API 0: ``propose`` is defined below the class that defines ``draft`` (a plugin that
        # overrides ``propose`` of Proposer, or of one of freespec's proposers). Its ``draft`` is the shim.
        # (By place in the MRO, not issubclass: this runs before ABCMeta has set up the new class, and an
        # issubclass check against it then would poison Proposer's own subclass cache.)
        mro = cls.__mro__
        cls._legacy = mro.index(_defined_in(cls, "propose")) < mro.index(_defined_in(cls, "draft"))
        if cls._legacy and cls.draft is not _draft_through_propose:
            cls._draft_before_shim = cls.draft
            cls.draft = _draft_through_propose

    _legacy: ClassVar[bool] = False

    @classmethod
    def is_concrete(cls) -> bool:
        """Whether the class can draft: it implements ``draft`` (or, deprecated, ``propose``) and is not abstract."""
        return ((cls.draft is not Proposer.draft or cls._legacy)
                and not getattr(cls, "__abstractmethods__", None))

    def gain_threshold(self, fixed: float) -> float:
        """Deprecated (API 0): the bar, ``StepContext.bar`` now."""
        return fixed if self.token_cost is None else self.token_cost

    def fixed_bar(self) -> Optional[float]:
        """The bar the policy cuts this proposer's drafts at while it has no price (``StepContext.token_cost``
        None): the proposer's ``min_token_gain`` option where it has one; None: not cut."""
        value = getattr(self.options, "min_token_gain", None)
        return float(value) if isinstance(value, (int, float)) else None

    def bind(self, info: EngineInfo) -> None:
        """Called once before the first step with what is known about the target model."""

    def observe(self, scored: ScoredPositions) -> None:
        """The target's top-k at the positions scored in the last step (only if ``target_topk``)."""

    def wants_target_topk(self) -> bool:
        """Whether the next step's top-k should be captured (asked after each step's drafts).

        A proposer that will not use them while the load-aware bar stays where it is says no, so
        a full batch does not pay for copying top-k out of every logits row.
        """
        return self.target_topk > 0

    def draft(self, rows: Sequence[Row], step: StepContext) -> list[Draft]:
        """One ``Draft`` per row, in row order (a ``Drafts`` to name the seconds of several sources). Every
        subclass implements it."""
        raise NotImplementedError(f"{type(self).__name__} implements neither draft() nor propose()")

    def propose(self, rows: Sequence[Row], step: Optional[StepContext] = None) -> list[list[int]]:
        """The token ids vLLM would be given for these rows: ``draft``, cut where the policy cuts
        (``scorers.policy.cut``) at ``step``'s bar. For tests and offline replays; the adapter calls
        ``draft``. (A proposer written against API 0 overrides this instead of ``draft``.)"""
        from freespec.scorers.policy import cut

        step = step or StepContext(token_cost=self.token_cost)
        bar = step.bar(self.fixed_bar())
        draft = type(self).draft
        if draft is _draft_through_propose:  # an API 0 subclass asking its parent (``super().propose``)
            draft = type(self)._draft_before_shim
        return [cut(d, bar).tokens for d in draft(self, rows, step)]

    def candidates(self, rows: Sequence[Row], step: Optional[StepContext] = None) -> list[Optional["Candidates"]]:
        """Each row's candidate chains, for a plugin that fuses several sources (``hybrid``).

        By default the draft ``draft`` returns, whole, with its chances as per-token chances (each token's
        given those before it): fusion weighs it with the other sources' and the policy cuts the fused draft,
        once. A source that knows several continuations (``retrieval``: every sampled occurrence) offers them all.
        """
        from freespec.scorers.fusion import Candidates

        out: list[Optional[Candidates]] = []
        for d in self.draft(rows, step or StepContext()):
            if not d.tokens:
                out.append(None)
                continue
            probs = None
            if d.chances is not None and len(d.chances) >= len(d.tokens):
                path = [float(c) for c in d.chances[: len(d.tokens)]]
                probs = np.asarray([[p / prev if prev > 0 else 0.0 for p, prev in zip(path, [1.0] + path[:-1])]])
            out.append(Candidates(type(self).__name__, np.asarray([d.tokens], dtype=np.int64), np.ones(1),
                                  token_probs=probs))
        return out

    def release(self, key: int) -> None:
        """The request ``key`` left the batch: drop what is kept for it."""

    def step_time_needed(self) -> Optional[tuple[float, str]]:
        """Seconds one step may legitimately take under this proposer's own options, and why; None: no claim.

        A plugin whose options make some steps slow by design (``pearl`` catching a draft up on a whole
        prompt inside the step) says so here, and the adapter raises its circuit breaker's step budget to
        match unless the operator set ``step_budget_ms`` (then it warns). The seconds must be bounded by
        the plugin's own timeout, so a stalled step is still cut off.
        """
        return None

    def state_bytes(self) -> int:
        """Approximate bytes of state held now (for docs and the bounds tests)."""
        return 0

    def file_events(self) -> dict[str, int]:
        """Counts so far of persisted-state work (``save``, ``save_error``, ``merge``), for metrics."""
        return {}


_warned_legacy: set[str] = set()


def _defined_in(cls: type, name: str) -> type:
    return next(c for c in cls.__mro__ if name in c.__dict__)


def _draft_through_propose(self: Proposer, rows: Sequence[Row], step: StepContext) -> list[Draft]:
    """``draft`` of a proposer written against API 0, which implemented ``propose(rows) -> list[list[int]]``
    and read ``self.token_cost``: warns once, sets the attribute, and reads the old per-call getters
    (``draft_chances``, ``draft_sources``, ``source_seconds``). It goes in the next major release."""
    _warn_legacy(type(self))
    self.token_cost = step.token_cost
    if hasattr(self, "observe_capture_seconds"):
        self.observe_capture_seconds(step.capture_seconds)
    tokens = self.propose(rows)
    chances = _legacy_answer(self, "draft_chances", len(tokens))
    sources = _legacy_answer(self, "draft_sources", len(tokens))
    seconds = _legacy_answer(self, "source_seconds", None)
    return Drafts([Draft(list(t), chances[i] if chances else None, sources[i] if sources else None)
                   for i, t in enumerate(tokens)], dict(seconds) if isinstance(seconds, dict) else None)


def _warn_legacy(cls: type) -> None:
    name = f"{cls.__module__}.{cls.__qualname__}"
    if name not in _warned_legacy:
        _warned_legacy.add(name)
        logger.warning(
            "freespec: proposer %s implements propose(rows), the API 0 contract; it runs through a shim that "
            "goes in the next major release: implement draft(rows, step) (docs/proposer-api.md)", name)


def _legacy_answer(proposer: Proposer, getter: str, rows: Optional[int]):
    """An API 0 per-call getter's answer (``draft_chances``, ``draft_sources``, ``source_seconds``); None when
    the proposer has none, it raises, or it answers for another number of rows."""
    method = getattr(proposer, getter, None)
    if method is None:
        return None
    try:
        answer = method()
    except Exception:
        return None
    if rows is not None and (not isinstance(answer, list) or len(answer) != rows):
        return None
    return answer
