"""A proposer that fails now and then, for the fault-injection test (loaded as a ``module:Class`` plugin)."""
from freespec.proposers.copy import CopyProposer


class FaultyProposer(CopyProposer):
    """The copy proposer, except that every third step raises."""

    calls = 0

    def propose(self, rows):
        self.calls += 1
        if self.calls % 3 == 0:
            raise RuntimeError("injected proposer fault")
        return super().propose(rows)
