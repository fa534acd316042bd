"""``pearl``: a draft model drafting while the target verifies (the proposer, its draft worker and placements)."""
from freespec.proposers.pearl.proposer import PearlOptions, PearlProposer

__all__ = ["PearlOptions", "PearlProposer"]
