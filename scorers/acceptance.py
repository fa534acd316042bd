"""Online acceptance estimates and the draft length they justify.

Model: a draft is verified token by token and the chain stops at the first
rejection, so with a per-token acceptance probability ``alpha`` the i-th draft
token is accepted with probability ``alpha**i``. Each observation (``d``
drafted, ``a`` accepted) contributes ``a`` successes and one failure when
``a < d``; the estimate is the posterior mean under a Beta prior.

The draft length is the longest ``l <= k`` whose last token still has
``alpha**l >= min_token_gain``: one more draft token is worth verifying while
its chance of being accepted pays for the extra verification work. (The
load-aware policy that measures that cost online is issue 7's; here it is an
option.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


@dataclass
class AcceptanceEstimate:
    """Beta-posterior estimate of per-token acceptance for one class of drafts."""

    successes: float = 1.0  # prior: one accepted ...
    failures: float = 1.0  # ... and one rejected token (alpha = 0.5)
    skipped: int = 0  # drafts withheld because they did not pay (callers use it to probe now and then)

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


def draft_length(alpha: float, k: int, min_token_gain: float) -> int:
    """Longest l <= k with alpha**l >= min_token_gain (0 when even one token does not pay)."""
    if k <= 0 or alpha <= 0.0 or alpha < min_token_gain:
        return 0
    if alpha >= 1.0 or min_token_gain <= 0.0:
        return k
    return max(0, min(k, int(math.floor(math.log(min_token_gain) / math.log(alpha) + 1e-9))))


def matched_prefix(chain: Sequence[int], produced: Sequence[int]) -> tuple[int, int]:
    """(leading chain tokens equal to what the target produced, tokens that could be compared).

    Plain lists are fastest here (a chain has at most k tokens); numpy arrays work too."""
    compared = min(len(chain), len(produced))
    for i in range(compared):
        if chain[i] != produced[i]:
            return i, compared
    return compared, compared
