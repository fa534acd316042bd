"""Online acceptance estimates, and how much of a chain the target produced.

Model: a draft is verified token by token and the chain stops at the first
rejection, so with a per-token acceptance probability ``alpha`` the i-th draft
token is accepted with probability ``alpha**i``. Each observation (``d``
drafted, ``a`` accepted) contributes ``a`` successes and one failure when
``a < d``; the estimate is the posterior mean under a Beta prior.

A proposer offers its i-th token with the chance ``alpha**i``; the policy cuts the
draft where that chance stops paying for its verification (``scorers.policy.cut``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass
class AcceptanceEstimate:
    """Beta-posterior estimate of per-token acceptance for one class of drafts."""

    successes: float = 1.0  # prior: one accepted ...
    failures: float = 1.0  # ... and one rejected token (alpha = 0.5)

    @property
    def alpha(self) -> float:
        return self.successes / (self.successes + self.failures)

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        accepted = max(0, min(accepted, drafted))
        self.successes += accepted
        if accepted < drafted:
            self.failures += 1

    def decay(self, keep: float) -> None:
        """Forget old evidence so the estimate follows a changing workload."""
        self.successes = max(1.0, self.successes * keep)
        self.failures = max(1.0, self.failures * keep)


def matched_prefix(chain: Sequence[int], produced: Sequence[int]) -> tuple[int, int]:
    """(leading chain tokens equal to what the target produced, tokens that could be compared).

    Plain lists are fastest here (a chain has at most k tokens); numpy arrays work too."""
    compared = min(len(chain), len(produced))
    for i in range(compared):
        if chain[i] != produced[i]:
            return i, compared
    return compared, compared
