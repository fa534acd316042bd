"""The ``{"plugin": NAME, ...}`` spelling of a speculative config, as vLLM >= 0.34 takes it.

On Model Runner V2 a freespec plugin is the registered method ``freespec_NAME`` and its options travel in
``speculator_options``: ``{"plugin": "hybrid", "num_speculative_tokens": 8, "policy": "fixed", "copy": {...}}``
becomes ``{"method": "freespec_hybrid", "num_speculative_tokens": 8, "speculator_options": {...}}``.
Pure: no vLLM import; the front-end calls it where V2 is the runner (``version_gate.uses_v2_registry``).
"""
from __future__ import annotations

from typing import Any

from freespec.vllm_plugins.frontend import VLLM_KEYS, FreespecConfigError
from freespec.vllm_plugins.v2.options import method_name, normalized_speculator_options


def v2_speculative_config(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` (with ``plugin``) as vLLM 0.34's speculative config; a bad config is refused naming the field,
    before any engine starts (the same checks as the V1 spelling: ``frontend.translate``)."""
    spec = dict(spec)
    plugin = spec.pop("plugin", None)
    if not isinstance(plugin, str):
        raise FreespecConfigError(f"speculative_config 'plugin' must be a plugin name, got {plugin!r}")
    for key in ("method", "model", "speculator_options"):
        if key in spec:
            raise FreespecConfigError(
                f"speculative_config has both 'plugin' and {key!r}: 'plugin' selects the method and takes the "
                "options itself")
    if ":" in plugin:
        raise FreespecConfigError(
            f"speculative_config 'plugin' {plugin[:200]!r}: on vLLM >= 0.34 a plugin runs as a registered method, "
            "so it must be installed under a name (the freespec.proposers entry points), not named by class path")
    k = spec.get("num_speculative_tokens")
    raw = {key: spec.pop(key) for key in list(spec) if key not in VLLM_KEYS}
    return {"method": method_name(plugin), **spec,
            "speculator_options": normalized_speculator_options(plugin, k, raw)}
