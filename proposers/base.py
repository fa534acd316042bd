"""The proposer API: the base class a freespec plugin subclasses, and every name a plugin imports.

This module is all a plugin imports (docs/proposer-api.md): ``Proposer`` and ``ProposerOptions`` are defined
here, the step's types (``Row``, ``StepContext``, ``Draft``, ``Drafts``, ``EngineInfo``, ``ScoredPositions``,
``Candidates``) in ``freespec.proposers.api`` and re-exported. Once per engine step the adapter
(``freespec.vllm_plugins.adapter``) calls ``Proposer.draft(rows, step)``; the goodput cut and the step sizing
are applied once, by the policy, to what comes back (``freespec.scorers.policy``).

Proposers are engine-agnostic: numpy arrays of token ids in, lists of token ids out; no vLLM import.
"""
from __future__ import annotations

from abc import ABC
from typing import ClassVar, Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

from freespec.option_checks import refuse_string_numbers
from freespec.proposers.api import (
    API_VERSION, Candidates, Draft, Drafts, EngineInfo, Row, ScoredPositions, StepContext,
)
from freespec.scorers.policy import cut

__all__ = ["API_VERSION", "Candidates", "Draft", "Drafts", "EngineInfo", "Proposer", "ProposerOptions", "Row",
           "ScoredPositions", "StepContext"]


class ProposerOptions(BaseModel):
    """Base of every plugin's options: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _one_coercion_rule(cls, data):
        """Strings are never converted to numbers (``freespec.option_checks``): one rule for every option."""
        return refuse_string_numbers(cls, data)


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

    def __init__(self, options: ProposerOptions, num_speculative_tokens: int) -> None:
        self.options = options
        self.k = num_speculative_tokens

    @classmethod
    def is_concrete(cls) -> bool:
        """Whether the class can draft: it implements ``draft`` and is not abstract."""
        return cls.draft is not Proposer.draft and not getattr(cls, "__abstractmethods__", None)

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
        raise NotImplementedError(f"{type(self).__name__} does not implement draft()")

    def propose(self, rows: Sequence[Row], step: Optional[StepContext] = None) -> list[list[int]]:
        """The token ids vLLM would be given for these rows: ``draft``, cut where the policy cuts
        (``scorers.policy.cut``) at ``step``'s bar. For tests and offline replays; the adapter calls ``draft``."""
        step = step or StepContext()
        bar = step.bar(self.fixed_bar())
        return [cut(d, bar).tokens for d in self.draft(rows, step)]

    def candidates(self, rows: Sequence[Row], step: Optional[StepContext] = None) -> list[Optional[Candidates]]:
        """Each row's candidate chains, for a plugin that fuses several sources (``hybrid``).

        By default the draft ``draft`` returns, whole, with its chances as per-token chances (each token's
        given those before it): fusion weighs it with the other sources' and the policy cuts the fused draft,
        once. A source that knows several continuations (``retrieval``: every sampled occurrence) offers them all.
        """
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

    def idle(self) -> bool:
        """The engine has taken no step for a while (``vllm_plugins.idle_save.IDLE_S``): a proposer with saved
        state keeps what it learned from requests not yet released (vLLM says a request finished only at the
        next step) and saves when its save is due. Called from another thread while no step runs, again while
        the engine stays idle, and at once while it returns True (more bounded work waits: a replica's file
        merged in a step's worth at a time); a step waits for the call in progress. No file I/O here."""
        return False

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
