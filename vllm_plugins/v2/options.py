"""A V2 method's ``speculator_options``: checked once, with the checks of the ``{"plugin": ...}`` spelling.

``speculator_options`` is the flat dict a ``{"plugin": NAME, ...}`` config holds besides ``plugin`` and
``num_speculative_tokens``: the plugin's own options and the adapter's keys (``policy``, ``scope``,
``state_dir``, ...). A bad one is refused naming the field (``frontend.FreespecConfigError``). No vLLM import.
"""
from __future__ import annotations

from typing import Any

from freespec.proposers.registry import UnknownPluginError
from freespec.vllm_plugins.adapter_options import ADAPTER_KEYS, AdapterOptions
from freespec.vllm_plugins.frontend import (
    REFUSED_KEYS, FreespecConfigError, check_k, checked_adapter_options, validate_options,
)

PREFIX = "freespec_"


def method_name(plugin: str) -> str:
    """The registered method of a freespec plugin: ``hybrid`` -> ``freespec_hybrid``."""
    return PREFIX + plugin


def checked_speculator_options(plugin: str, k: Any, raw: Any) -> tuple[Any, AdapterOptions]:
    """(the plugin's validated options, the adapter's options) of ``raw``; FreespecConfigError naming the field."""
    check_k(plugin, k)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise FreespecConfigError(f"freespec plugin {plugin!r}: 'speculator_options' must be a JSON object, "
                                  f"got {type(raw).__name__}")
    for key, why in REFUSED_KEYS.items():
        if key in raw:
            raise FreespecConfigError(f"freespec plugin {plugin!r}: speculator_options {key!r} {why}")
    adapter = checked_adapter_options({key: raw[key] for key in ADAPTER_KEYS if key in raw})
    try:
        options = validate_options(plugin, {key: value for key, value in raw.items() if key not in ADAPTER_KEYS})
    except UnknownPluginError as e:
        raise FreespecConfigError(f"speculative_config 'plugin': {e}") from None
    return options, adapter


def normalized_speculator_options(plugin: str, k: Any, raw: Any) -> dict[str, Any]:
    """``raw`` checked, as the flat dict the workers read: every option of the plugin with its default filled in,
    and the adapter's keys that were given. Checking it again gives the same dict."""
    options, adapter = checked_speculator_options(plugin, k, raw)
    given = {key: value for key, value in adapter.model_dump().items() if key in (raw or {})}
    return {**options.model_dump(mode="json"), **given}
