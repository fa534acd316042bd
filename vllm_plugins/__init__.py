"""Everything in freespec that touches vLLM lives in this package."""
from __future__ import annotations

import logging


def register() -> None:
    """vLLM general-plugin entry point, run in every vLLM process (API server, engine core, workers).

    Installs only the front-end, which passes every speculative config that is not freespec's through
    untouched; the other patches act only in engines that run a freespec plugin, or as the operator's
    ``FREESPEC_FIX_VLLM`` asks (``patches.install_all``). On vLLM >= 0.34 (Model Runner V2 only) it also registers
    every plugin as the speculative method ``freespec_<plugin>`` (``v2.registry``); below, nothing of ``v2`` is
    imported. Never raises: vLLM calls general plugins unguarded.
    """
    from freespec.vllm_plugins.patches import install_all
    from freespec.vllm_plugins.version_gate import uses_v2_registry

    install_all()
    try:
        import vllm

        if uses_v2_registry(getattr(vllm, "__version__", "")):
            from freespec.vllm_plugins.v2.registry import register as register_v2

            register_v2()
    except Exception as e:
        logging.getLogger("freespec").warning("freespec: could not register its V2 speculative methods (%r)", e)
