"""The default `hybrid` with its bar raised by how optimistic its chances have been (an A/B, not the product).

The adapter's counters showed the default's draft chances a third optimistic on the Zen 3 machine (expected
1,440 accepted tokens, 1,078 accepted; /tmp/run-be's worker log), where a verified token costs about a tenth
of a step. This class keeps the ratio r of accepted to expected draft tokens over recent drafts (decayed,
half-life HALF_LIFE drafts, PRIOR expected tokens at r = 1) and drafts against the bar token_cost / r (so a
prefix is kept while its corrected chance r * p pays), offering the corrected chances to the step size.

    PYTHONPATH=results/chance-scale-ab freespec bench ... --configs none suffix hybrid '{"plugin": "strict:StrictHybrid"}'
"""
from __future__ import annotations

from freespec.proposers.hybrid import HybridProposer
from freespec.scorers.acceptance import matched_prefix

HALF_LIFE = 200.0  # drafts
PRIOR = 20.0  # expected tokens behind the starting ratio of 1


class StrictHybrid(HybridProposer):
    def __init__(self, options, num_speculative_tokens: int) -> None:
        super().__init__(options, num_speculative_tokens)
        self._accepted, self._expected = PRIOR, PRIOR
        self._drafted: dict[int, tuple[int, list[int], float]] = {}  # key -> (length then, draft, expected)

    @property
    def ratio(self) -> float:
        return min(1.5, max(0.25, self._accepted / self._expected))

    def propose(self, rows):
        keep = 0.5 ** (1.0 / HALF_LIFE)
        for row in rows:
            drafted = self._drafted.pop(row.key, None)
            if drafted is None or row.num_new == 0:
                continue
            start, draft, expected = drafted
            matched, _ = matched_prefix(draft, row.tokens[start : start + len(draft) + 1].tolist())
            self._accepted = keep * self._accepted + matched
            self._expected = keep * self._expected + expected
        r, cost = self.ratio, self.token_cost
        if cost is not None:
            self.token_cost = cost / r
        try:
            drafts = super().propose(rows)
        finally:
            self.token_cost = cost
        chances = self._chances or []
        for i, row in enumerate(rows):
            if row.num_new > 0 and drafts[i] and i < len(chances):
                self._drafted[row.key] = (len(row.tokens), list(drafts[i]), float(sum(chances[i][: len(drafts[i])])))
        self._chances = [[r * c for c in cs] for cs in chances]
        return drafts

    def release(self, key: int) -> None:
        self._drafted.pop(key, None)
        super().release(key)
