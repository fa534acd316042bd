"""``recycle``: token recycling (the proposer, and the adjacency matrix it saves, loads and merges)."""
from freespec.proposers.recycle.proposer import RecycleOptions, RecycleProposer

__all__ = ["RecycleOptions", "RecycleProposer"]
