"""The ``"plugin": NAME`` front-end of ``--speculative-config``.

Named patch ``speculative_config_frontend``: vLLM has no registry of
speculative methods, so freespec wraps ``EngineArgs.create_speculative_config``
(called in the process that parses the arguments, before the ``VllmConfig`` is
built). A dict carrying ``plugin`` is validated against that plugin's options
and rewritten into vLLM's own ``custom_class`` seam; the validated options
travel to the workers in ``additional_config["freespec"]``. Everything else
vLLM does with the config is untouched.

The stock-vLLM spelling that needs no front-end is equivalent:
``{"method": "custom_class", "model": "freespec.vllm_plugins.adapter.FreespecProposer",
"num_speculative_tokens": K}`` with ``--additional-config
'{"freespec": {"plugin": NAME, "options": {...}}}'``.
"""
from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from freespec.proposers.registry import load_proposer_class
from freespec.safe_files import short
from freespec.vllm_plugins.adapter_options import ADAPTER_KEYS, AdapterOptions, adapter_options

logger = logging.getLogger("freespec")

ADAPTER_CLASS = "freespec.vllm_plugins.adapter.FreespecProposer"
ADDITIONAL_CONFIG_KEY = "freespec"


class FreespecConfigError(ValueError):
    """A freespec speculative config that cannot be used; the message names the field."""


def describe_options(options_cls) -> str:
    parts = []
    for name, field in options_cls.model_fields.items():
        parts.append(f"{name}={field.default!r} ({field.description or field.annotation})")
    return "; ".join(parts)


MAX_PROBLEMS = 5  # problems listed in one message


def validate_options(plugin: str, raw: dict[str, Any]):
    """Validate ``raw`` against ``plugin``'s options model; errors name the field."""
    options_cls = load_proposer_class(plugin).Options
    try:
        return options_cls.model_validate(raw)
    except ValidationError as e:
        problems = []
        for err in e.errors()[:MAX_PROBLEMS]:  # a 1,000,000-entry list makes one message, not 1,000,000
            field = ".".join(str(p) for p in err["loc"]) or "(options)"
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown option {field!r}")
            else:
                problems.append(f"option {field!r}: {err['msg']} (got {short(err.get('input'))})")
        raise FreespecConfigError(
            f"freespec plugin {plugin!r}: " + "; ".join(problems)
            + (f"; and {e.error_count() - MAX_PROBLEMS} more" if e.error_count() > MAX_PROBLEMS else "")
            + f". Allowed options: {describe_options(options_cls)}"
        ) from None


# Keys of a ``{"plugin": ...}`` config that stay with vLLM; every other key is a plugin option
# or one of the adapter's own keys.
VLLM_KEYS = ("num_speculative_tokens",)
# K sizes every step's drafting and verification work (per request: K draft tokens scored by the target,
# K-deep proposer searches); 64 is far past where a draft pays (the oracle drafts of docs/benchmark.md reach
# about 8.6 tokens per forward at K = 8), and bounds the work of a typo such as 8000.
MAX_SPECULATIVE_TOKENS = 64
# Keys users bring from other vLLM releases or docs that no supported vLLM accepts: refused here with
# the freespec replacement, instead of vLLM's bare "Unexpected keyword argument" at engine start.
REFUSED_KEYS = {
    "disable_by_batch_size": (
        "is not a SpeculativeConfig field in any supported vLLM release (0.31 to 0.34), which would refuse it. "
        "freespec's load-aware policy does that job: \"policy\": \"goodput\" (the default) stops drafting "
        "when verification costs more than the drafts save, e.g. under a large batch (docs/policy.md); "
        "remove the key"
    ),
}
def check_k(plugin: str, k: Any) -> int:
    """``num_speculative_tokens``, checked against ``MAX_SPECULATIVE_TOKENS``; the error names the field."""
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise FreespecConfigError(
            f"freespec plugin {plugin!r}: 'num_speculative_tokens' must be an integer in "
            f"[1, {MAX_SPECULATIVE_TOKENS}], got {k!r}"
        )
    return k


def checked_adapter_options(raw: dict[str, Any]) -> AdapterOptions:
    """The adapter's keys of a speculative config (``adapter_options``), refused as a FreespecConfigError."""
    try:
        return adapter_options(raw)
    except ValueError as e:
        raise FreespecConfigError(str(e)) from None


def check_additional_config(cfg: Any, k: Any) -> tuple[str, Any, AdapterOptions]:
    """``additional_config["freespec"]`` as the adapter reads it, with the checks ``translate`` applies to the
    ``{"plugin": ...}`` spelling, so the plain-vLLM spelling (``--additional-config``) is refused with the
    same messages: (plugin, its validated options, the adapter's options)."""
    if not isinstance(cfg, dict) or not isinstance(cfg.get("plugin"), str):
        raise FreespecConfigError(
            "freespec's custom_class adapter needs additional_config "
            '{"freespec": {"plugin": NAME, "options": {...}}}; '
            'or use --speculative-config \'{"plugin": NAME, ...}\''
        )
    plugin = cfg["plugin"]
    unknown = sorted(set(cfg) - {"plugin", "options", *ADAPTER_KEYS})
    if unknown:
        raise FreespecConfigError(
            f"freespec: additional_config {ADDITIONAL_CONFIG_KEY!r} has unknown key(s) {unknown}; allowed: "
            f"plugin, options, {', '.join(ADAPTER_KEYS)}"
        )
    options = cfg.get("options") or {}
    if not isinstance(options, dict):
        raise FreespecConfigError(f"freespec plugin {plugin!r}: 'options' must be a JSON object, got {options!r}")
    check_k(plugin, k)
    return plugin, validate_options(plugin, options), checked_adapter_options(cfg)


def translate(
    spec: dict[str, Any], additional_config: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Rewrite a ``{"plugin": ...}`` speculative config into vLLM's ``custom_class`` seam.

    Returns the new speculative config and the new additional config.
    """
    spec = dict(spec)
    plugin = spec.pop("plugin")
    if not isinstance(plugin, str):
        raise FreespecConfigError(f"speculative_config 'plugin' must be a plugin name, got {plugin!r}")
    for key in ("method", "model"):
        if key in spec:
            raise FreespecConfigError(
                f"speculative_config has both 'plugin' and {key!r}: 'plugin' selects the method itself"
            )
    check_k(plugin, spec.get("num_speculative_tokens"))
    for key, why in REFUSED_KEYS.items():
        if key in spec:
            raise FreespecConfigError(f"freespec plugin {plugin!r}: speculative_config {key!r} {why}")
    # checked here, so vllm serve does not start with a bad value; step_budget_ms not given stays None: the
    # adapter's default, or what the plugin's options need
    adapter = checked_adapter_options({key: spec.pop(key) for key in ADAPTER_KEYS if key in spec}).model_dump()
    raw_options = {key: spec.pop(key) for key in list(spec) if key not in VLLM_KEYS}
    options = validate_options(plugin, raw_options)
    new_spec = {"method": "custom_class", "model": ADAPTER_CLASS, **spec}
    new_additional = dict(additional_config or {})
    new_additional[ADDITIONAL_CONFIG_KEY] = {
        "plugin": plugin,
        "options": options.model_dump(mode="json"),
        **adapter,
    }
    return new_spec, new_additional
