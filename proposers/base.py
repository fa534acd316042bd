"""What every freespec proposer is: options, the rows it sees, and drafts it returns.

Proposers are engine-agnostic: they see numpy arrays of token ids and return
lists of token ids. The vLLM adapter (``freespec.vllm_plugins.adapter``) turns
vLLM's batch into ``Row`` objects and sanitises what comes back.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar, Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from freespec.scorers.fusion import Candidates


class ProposerOptions(BaseModel):
    """Base of every plugin's options: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


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


class Proposer(ABC):
    """A drafting algorithm. Subclasses set ``Options`` and implement ``propose``."""

    Options: ClassVar[type[ProposerOptions]] = ProposerOptions
    # > 0: the proposer wants the target's top-``target_topk`` candidates at every scored
    # position, delivered through ``observe`` before each ``propose``.
    target_topk: int = 0  # instances may set it from their options
    # Set by the adapter before each step when the load-aware policy is on: the expected
    # accepted tokens one more draft token must bring to pay for verifying it (scorers/policy.py).
    token_cost: Optional[float] = None
    # True: the plugin weighs its own drafting time itself (``hybrid``'s source pricing), so the load-aware
    # policy fits the target's step time without it. Otherwise a slow source (a draft model's chain) is
    # counted in the price of every verified token, twice over with the pricing.
    prices_own_time: bool = False

    def __init__(self, options: ProposerOptions, num_speculative_tokens: int) -> None:
        self.options = options
        self.k = num_speculative_tokens

    def gain_threshold(self, fixed: float) -> float:
        """The bar for one more draft token: the policy's measured cost, else the plugin's fixed option."""
        return fixed if self.token_cost is None else self.token_cost

    def bind(self, info: EngineInfo) -> None:
        """Called once before the first step with what is known about the target model."""

    def observe(self, scored: ScoredPositions) -> None:
        """The target's top-k at the positions scored in the last step (only if ``target_topk``)."""

    def observe_capture_seconds(self, seconds: float) -> None:
        """Seconds the adapter spent in the last step capturing the target's top-k for this proposer
        (0 when it captured none); ``hybrid`` charges them to its ``recycle`` source."""

    def wants_target_topk(self) -> bool:
        """Whether the next step's top-k should be captured (asked after each step's drafts).

        A proposer that will not use them while the load-aware bar stays where it is says no, so
        a full batch does not pay for copying top-k out of every logits row.
        """
        return self.target_topk > 0

    @abstractmethod
    def propose(self, rows: Sequence[Row]) -> list[list[int]]:
        """One draft (0..k token ids) per row, in row order."""

    def candidates(self, rows: Sequence[Row]) -> list[Optional["Candidates"]]:
        """Each row's candidate chains, for a plugin that fuses several sources (``hybrid``).

        By default the one draft ``propose`` returns; a source that knows several continuations
        (``retrieval``: every sampled occurrence) offers them all, so fusion weighs them.
        """
        from freespec.scorers.fusion import Candidates

        return [Candidates(type(self).__name__, np.asarray([d], dtype=np.int64), np.ones(1)) if d else None
                for d in self.propose(rows)]

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

    def draft_sources(self) -> Optional[list[Optional[str]]]:
        """For the last ``propose``: the source each row's draft came from (metrics label it by source);
        None when the plugin is its own one source."""
        return None

    def draft_chances(self) -> Optional[list[list[float]]]:
        """For the last ``propose``: per row, the chance that each draft token and all before it are
        accepted, as the plugin estimates it (the adapter may then drop a draft's last tokens where a
        smaller step pays better: ``GoodputPolicy.step_size``); None when the plugin does not estimate it."""
        return None

    def source_seconds(self) -> Optional[dict[str, float]]:
        """For the last ``propose``: the seconds each of the plugin's sources took (metrics, the benchmark's
        per-source time); None when the plugin is its own one source."""
        return None

    def file_events(self) -> dict[str, int]:
        """Counts so far of persisted-state work (``save``, ``save_error``, ``merge``), for metrics."""
        return {}
