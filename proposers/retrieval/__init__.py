"""``retrieval``: drafts from a tokenized datastore (the proposer, suffix-array search, datastore reader, builder).

The proposer is imported on first use (``freespec.proposers.retrieval.RetrievalProposer``): its search loads
numba, which must not reach processes that only check a config (vLLM's API server forks workers, and numba
loaded there broke them at start). The datastore reader needs only numpy.
"""
__all__ = ["RetrievalOptions", "RetrievalProposer"]


def __getattr__(name: str):
    if name in __all__:
        from freespec.proposers.retrieval import proposer

        return getattr(proposer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
