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


def validate_options(plugin: str, raw: dict[str, Any]):
    """Validate ``raw`` against ``plugin``'s options model; errors name the field."""
    options_cls = load_proposer_class(plugin).Options
    try:
        return options_cls.model_validate(raw)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            field = ".".join(str(p) for p in err["loc"]) or "(options)"
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown option {field!r}")
            else:
                problems.append(f"option {field!r}: {err['msg']} (got {err.get('input')!r})")
        raise FreespecConfigError(
            f"freespec plugin {plugin!r}: " + "; ".join(problems)
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
        "is not a SpeculativeConfig field in any supported vLLM release (0.31 to 0.33), which would refuse it. "
        "freespec's load-aware policy does that job: \"policy\": \"goodput\" (the default) stops drafting "
        "when verification costs more than the drafts save, e.g. under a large batch (docs/policy.md); "
        "remove the key"
    ),
}
# The adapter's keys, with their allowed values (first: default). ``policy``: "goodput" sets every
# step's bar for one more draft token from measured step times (scorers/policy.py); "fixed" uses each
# plugin's own threshold, for experiments. Goodput is the default: in the load sweep (docs/policy.md)
# it was as fast or faster than "fixed" at every load, and within 4% of no speculation at 39 requests.
# ``pad``: "auto" gives a one-request step the size with the most expected output per measured second
# (GoodputPolicy.step_size; on the CPU here a step scoring 5 tokens was faster than one scoring 1 or 9): the
# draft is padded, or its last tokens dropped where the plugin estimates their chances; "longer" only pads;
# "off" neither. It needs the goodput policy's step times: with "fixed" there are none.
ADAPTER_KEYS = {"policy": ("goodput", "fixed"), "pad": ("auto", "longer", "off")}
# The adapter's numeric keys: (default, lowest, highest). ``step_budget_ms``: a plugin step (everything the
# adapter calls on the plugin in one engine step) that takes longer counts as a bad step for the circuit
# breaker (adapter.CircuitBreaker: 3 bad steps in a row, or one over 10x the budget, switch the plugin off
# for a back-off period). 1000 ms: far above what the context sources take per step, and above what
# `pearl` waits for its draft model's chain on a CPU, whose step legitimately blocks on the draft
# (docs/reliability.md). Not given, it is left None here: the adapter raises the default to what a plugin's
# own options need (``Proposer.step_time_needed``: pearl with a large ``sync_feed_tokens``).
ADAPTER_NUMBERS = {"step_budget_ms": (1000.0, 1.0, 60_000.0)}


def adapter_number(key: str, value: Any) -> float:
    """One of the adapter's numeric keys, checked against its bounds; the error names the field."""
    default, low, high = ADAPTER_NUMBERS[key]
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise FreespecConfigError(
            f"freespec: speculative_config {key!r} must be a number in [{low:g}, {high:g}], got {value!r}"
        )
    return float(value)


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
    k = spec.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise FreespecConfigError(
            f"freespec plugin {plugin!r}: 'num_speculative_tokens' must be an integer in "
            f"[1, {MAX_SPECULATIVE_TOKENS}], got {k!r}"
        )
    for key, why in REFUSED_KEYS.items():
        if key in spec:
            raise FreespecConfigError(f"freespec plugin {plugin!r}: speculative_config {key!r} {why}")
    adapter = {}
    for key, allowed in ADAPTER_KEYS.items():
        value = spec.pop(key, allowed[0])
        if value not in allowed:
            raise FreespecConfigError(
                f"freespec: speculative_config {key!r} must be one of {list(allowed)}, got {value!r}"
            )
        adapter[key] = value
    for key in ADAPTER_NUMBERS:
        value = spec.pop(key, None)
        adapter_number(key, value)  # checked here, so vllm serve does not start with a bad value
        adapter[key] = value  # None: the adapter's default (or what the plugin's options need)
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
