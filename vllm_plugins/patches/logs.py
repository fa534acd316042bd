"""freespec's log records routed through vLLM's handlers."""
from __future__ import annotations

import logging


def route_logs_to_vllm() -> None:
    """Send freespec's log records through vLLM's handlers at vLLM's level (``VLLM_LOGGING_LEVEL``).

    Where vLLM configures no logging (``VLLM_CONFIGURE_LOGGING=0``) freespec's logger is left to the
    application's configuration.
    """
    ours, theirs = logging.getLogger("freespec"), logging.getLogger("vllm")
    if not ours.handlers and theirs.handlers:
        for handler in theirs.handlers:
            ours.addHandler(handler)
        if theirs.level != logging.NOTSET:
            ours.setLevel(theirs.level)
        ours.propagate = False
