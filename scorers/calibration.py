"""Learned acceptance chances of draft tokens, per (the source's own probability, match length, depth).

A source's own probabilities are counts (how often a continuation followed the matched context), not
acceptance rates; ``TokenCalibration`` learns, online, how often a token with that probability, found by a
match of that length at that depth of the draft, is accepted. The ``suffix`` and ``retrieval`` sources
each keep one, so ``hybrid`` weighs their tokens on one scale.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Sequence

from freespec.scorers.acceptance import AcceptanceCounts
from freespec.scorers.tuning import (
    CALIBRATION_DEPTH_EDGES,
    CALIBRATION_MATCH_EDGES,
    CALIBRATION_PRIOR_STRENGTH,
    CALIBRATION_PROB_EDGES,
    CALIBRATION_WINDOW,
)


class TokenCalibration(AcceptanceCounts):
    """Chance that a drafted token is accepted, given the previous ones were, per (probability, match, depth) cell.

    The probability is the source's own conditional estimate: a suffix tree's frequency of the token after
    the tokens before it (``suffix``), or the share of a datastore's continuations that go on with it
    (``retrieval``). A cell of ``AcceptanceCounts`` each, starting from that probability
    (``CALIBRATION_PRIOR_STRENGTH`` pseudo-observations), so a fresh server drafts like SuffixDecoding and then
    follows what it sees.
    Cells are flat indices into plain lists: a draft has a few tokens, and this runs every engine step
    right after the forward pass has flushed the CPU's caches, where each numpy call on a tiny array
    costs more than the Python it replaces.
    """

    def __init__(self) -> None:
        edges = CALIBRATION_PROB_EDGES
        mids = [0.15] + [(a + b) / 2 for a, b in zip(edges, edges[1:])] + [1.0]
        per_prob = (len(CALIBRATION_MATCH_EDGES) + 1) * (len(CALIBRATION_DEPTH_EDGES) + 1)
        prior = [min(mid, 0.9) for mid in mids for _ in range(per_prob)]
        super().__init__([CALIBRATION_PRIOR_STRENGTH * x for x in prior],
                         [CALIBRATION_PRIOR_STRENGTH * (1.0 - x) for x in prior], CALIBRATION_WINDOW)

    @staticmethod
    def cell(cond: float, match_len: int, depth: int) -> int:
        """A draft token's cell, from its conditional probability, the match length and its depth."""
        prob = (bisect_right(CALIBRATION_PROB_EDGES, cond) * (len(CALIBRATION_MATCH_EDGES) + 1)
                + bisect_right(CALIBRATION_MATCH_EDGES, match_len))
        return prob * (len(CALIBRATION_DEPTH_EDGES) + 1) + bisect_right(CALIBRATION_DEPTH_EDGES, depth)

    @classmethod
    def cells(cls, cond: Sequence[float], match_len: int) -> list[int]:
        """Each token's cell of a draft whose tokens have these conditional probabilities."""
        return [cls.cell(c, match_len, depth) for depth, c in enumerate(cond)]

    def chance(self, cond: float, match_len: int, depth: int) -> float:
        """The learned chance of one token."""
        return self.mean(self.cell(cond, match_len, depth))

    def estimate(self, cells: Sequence[int]) -> list[float]:
        s, f = self.successes, self.failures
        return [s[c] / (s[c] + f[c]) for c in cells]
