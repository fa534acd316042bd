"""Everything in freespec that touches vLLM lives in this package."""
from __future__ import annotations


def register() -> None:
    """vLLM general-plugin entry point, run in every vLLM process (API server, engine core, workers).

    Installs only the front-end, which passes every speculative config that is not freespec's through
    untouched; the other patches act only in engines that run a freespec plugin, or as the operator's
    ``FREESPEC_FIX_VLLM`` asks (``patches.install_all``).
    """
    from freespec.vllm_plugins.patches import install_all

    install_all()
