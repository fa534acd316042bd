"""Everything in freespec that touches vLLM lives in this package."""
from __future__ import annotations


def register() -> None:
    """vLLM general-plugin entry point, run in every vLLM process (API server, engine core, workers)."""
    from freespec.vllm_plugins.patches import install_all

    install_all()
