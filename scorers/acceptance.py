"""Online acceptance estimates, and how much of a chain the target produced.

Model: a draft is verified token by token and the chain stops at the first
rejection, so with a per-token acceptance probability ``alpha`` the i-th draft
token is accepted with probability ``alpha**i``. Each observation (``d``
drafted, ``a`` accepted) contributes ``a`` successes and one failure when
``a < d``; the estimate is the posterior mean under a Beta prior.

``AcceptanceCounts`` is the one estimator: Beta counts per cell (a class of draft tokens), halved per cell
once its evidence passes a window. ``AcceptanceEstimate`` is one cell of it (copy's and fusion's per-class
rates); ``chain.EdgeAcceptance`` and ``calibration.TokenCalibration`` are tables of cells.

A proposer offers its i-th token with the chance ``alpha**i``; the policy cuts the
draft where that chance stops paying for its verification (``scorers.policy.cut``).
"""
from __future__ import annotations

import math
from typing import Any, Sequence


class AcceptanceCounts:
    """Beta counts of accepted and rejected draft tokens per cell, each cell's chance their posterior mean.

    A draft's tokens each belong to a cell; every token up to the first rejection adds a success to its cell,
    the rejected one a failure to its own. Once a cell holds more than ``window`` observations both its
    counts are halved, so the estimate follows a changing workload. ``successes`` and ``failures`` start at
    the prior's pseudo-counts: lists indexed by int cells (fastest for the few cells a step touches), or
    numpy arrays indexed by int or tuple cells.
    """

    def __init__(self, successes: Any, failures: Any, window: float = math.inf) -> None:
        self.successes, self.failures, self.window = successes, failures, window

    def mean(self, cell: Any) -> float:
        """The cell's chance: its posterior mean."""
        s = self.successes[cell]
        return s / (s + self.failures[cell])

    def observe(self, cells: Sequence[Any], accepted: int, compared: int | None = None) -> None:
        """A draft whose tokens are in ``cells`` (in order) was verified: its first ``accepted`` were right, and
        the next was wrong if ``accepted < compared`` (default: all of ``cells`` were compared)."""
        compared = len(cells) if compared is None else min(compared, len(cells))
        if compared <= 0:
            return
        accepted = max(0, min(accepted, compared))
        s, f = self.successes, self.failures
        for c in cells[:accepted]:
            s[c] += 1.0
        touched = cells[:accepted]
        if accepted < compared:
            f[cells[accepted]] += 1.0
            touched = cells[:accepted + 1]
        for c in dict.fromkeys(touched):
            if s[c] + f[c] > self.window:
                s[c] *= 0.5
                f[c] *= 0.5


class AcceptanceEstimate:
    """Per-token acceptance of one class of drafts: one cell of ``AcceptanceCounts``, starting from one
    accepted and one rejected token (alpha = 0.5)."""

    def __init__(self, window: float = math.inf) -> None:
        self.counts = AcceptanceCounts([1.0], [1.0], window)

    @property
    def successes(self) -> float:
        return self.counts.successes[0]

    @property
    def failures(self) -> float:
        return self.counts.failures[0]

    @property
    def alpha(self) -> float:
        return self.counts.mean(0)

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted > 0:
            self.counts.observe([0] * drafted, accepted)


def matched_prefix(chain: Sequence[int], produced: Sequence[int]) -> tuple[int, int]:
    """(leading chain tokens equal to what the target produced, tokens that could be compared).

    Plain lists are fastest here (a chain has at most k tokens); numpy arrays work too."""
    compared = min(len(chain), len(produced))
    for i in range(compared):
        if chain[i] != produced[i]:
            return i, compared
    return compared, compared
