"""``retrieval``: drafts from a tokenized datastore (the proposer, suffix-array search, datastore reader, builder)."""
from freespec.proposers.retrieval.proposer import RetrievalOptions, RetrievalProposer

__all__ = ["RetrievalOptions", "RetrievalProposer"]
