"""The default `hybrid` with its chances left uncorrected (the factor held at 1), to compare with the default.

    PYTHONPATH=results/calibration-ab freespec bench ... --configs suffix hybrid '{"plugin": "uncalibrated:UncalibratedHybrid"}'
"""
from freespec.proposers.hybrid import HybridProposer
from freespec.scorers.calibration import ChanceCalibration


class _HeldAtOne(ChanceCalibration):
    @property
    def factor(self) -> float:
        return 1.0


class UncalibratedHybrid(HybridProposer):
    def __init__(self, options, num_speculative_tokens: int) -> None:
        super().__init__(options, num_speculative_tokens)
        self.calibration = _HeldAtOne()
