"""What every freespec proposer is: options, the rows it sees, and drafts it returns.

Proposers are engine-agnostic: they see numpy arrays of token ids and return
lists of token ids. The vLLM adapter (``freespec.vllm_plugins.adapter``) turns
vLLM's batch into ``Row`` objects and sanitises what comes back.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict


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


class Proposer(ABC):
    """A drafting algorithm. Subclasses set ``Options`` and implement ``propose``."""

    Options: ClassVar[type[ProposerOptions]] = ProposerOptions

    def __init__(self, options: ProposerOptions, num_speculative_tokens: int) -> None:
        self.options = options
        self.k = num_speculative_tokens

    @abstractmethod
    def propose(self, rows: Sequence[Row]) -> list[list[int]]:
        """One draft (0..k token ids) per row, in row order."""

    def release(self, key: int) -> None:
        """The request ``key`` left the batch: drop what is kept for it."""

    def state_bytes(self) -> int:
        """Approximate bytes of state held now (for docs and the bounds tests)."""
        return 0
