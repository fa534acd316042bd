"""How far a plugin's draft chances are from what the target accepts, and the factor that corrects them.

A fused draft's prefix chances (``scorers/fusion.py``) multiply per-token supports that each source learned
on its own; in run AJ they summed to 1,207 expected tokens against 1,010 accepted, 20% optimistic.
``ChanceCalibration`` compares, over recent drafts, the chances of the draft tokens the target could judge
with the tokens it accepted, and scales later chances by that ratio, so the goodput bar and the step size
act on chances that hold on average. Memory: two floats. Work: one pass over a draft's chances per draft.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

KEEP = 1.0 - 1.0 / 256  # weight of the past per judged draft (half-life about 180 drafts)
PRIOR = 16.0  # tokens of imagined evidence at factor 1, so a few drafts do not swing the factor
LOWEST, HIGHEST = 0.25, 1.5  # the factor stays in this range whatever the evidence


@dataclass
class ChanceCalibration:
    expected: float = PRIOR  # decayed sum of the judged draft tokens' prefix chances
    accepted: float = PRIOR  # decayed sum of the draft tokens the target accepted

    @property
    def factor(self) -> float:
        return min(HIGHEST, max(LOWEST, self.accepted / self.expected))

    def observe(self, chances: Sequence[float], matched: int, compared: int) -> None:
        """One draft judged: its prefix chances (uncorrected), its leading tokens the target produced too,
        and how many of its tokens the target's output reached.

        A wrong token judges every token after it (none of them can be accepted); where every compared token
        was right, the tokens past the output are not judged yet and are left out.
        """
        if compared <= 0 or not chances:
            return
        judged = len(chances) if matched < compared else min(compared, len(chances))
        self.expected = self.expected * KEEP + float(sum(chances[:judged]))
        self.accepted = self.accepted * KEEP + min(matched, judged)

    def scale(self, chances: Sequence[float]) -> list[float]:
        """``chances`` corrected: each times the factor, at most 1 (still non-increasing)."""
        f = self.factor
        return [min(1.0, c * f) for c in chances]
