"""Register every freespec plugin as a vLLM >= 0.34 speculative method, ``freespec_<plugin>``.

Called by freespec's general plugin (``vllm_plugins.register``) in every vLLM process, where V2's registry is the
runner's seam (``version_gate.uses_v2_registry``): ``register_speculative_method(name, config)`` with one
``config.config_class`` per plugin of the ``freespec.proposers`` entry points (freespec's own and installed
third-party ones). Idempotent; a plugin that cannot be registered is logged and skipped, never raised (vLLM
calls general plugins unguarded).
"""
from __future__ import annotations

import logging

from vllm.v1.worker.gpu.spec_decode.speculator_config import register_speculative_method

from freespec.proposers.registry import available_plugins
from freespec.vllm_plugins.v2.config import config_class
from freespec.vllm_plugins.v2.options import method_name

logger = logging.getLogger("freespec")

_REGISTERED: dict[str, type] = {}  # method name -> the config class registered for it (one per process)


def register() -> list[str]:
    """Register each plugin's method once; the names registered in this process."""
    for plugin in sorted(available_plugins()):
        name = method_name(plugin)
        if name in _REGISTERED:
            continue
        try:
            cls = config_class(plugin)
            register_speculative_method(name, cls)
            _REGISTERED[name] = cls
        except Exception as e:  # a name vLLM owns, another package's method of the same name
            logger.warning("freespec: could not register speculative method %s (%r); it is skipped", name, e)
    return sorted(_REGISTERED)
