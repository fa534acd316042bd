"""Which vLLM engines use freespec: a speculative config as given, a ``vllm serve`` command line (read as
vLLM's parser reads its flags), and an engine's ``VllmConfig``."""
from __future__ import annotations

import json
import sys
from typing import Any, Iterator


V2_PREFIX = "freespec_"  # a freespec plugin's registered method on vLLM >= 0.34 (``vllm_plugins.v2``)


def is_freespec_spec(spec: Any) -> bool:
    """Whether a speculative config as given (a dict) asks for a freespec plugin: ``{"plugin": ...}``, or vLLM's
    own spelling ``{"method": "custom_class", "model": <freespec's adapter>}`` or, from vLLM 0.34, a registered
    ``{"method": "freespec_<plugin>"}``."""
    from freespec.vllm_plugins.frontend import ADAPTER_CLASS

    if not isinstance(spec, dict):
        return False
    method = spec.get("method")
    return ("plugin" in spec or (method == "custom_class" and spec.get("model") == ADAPTER_CLASS)
            or (isinstance(method, str) and method.startswith(V2_PREFIX)))


def flag_name(arg: str) -> str:
    """A command-line word's flag as vLLM's parser reads it: before any ``=``, ``_`` read as ``-``."""
    return arg.partition("=")[0].replace("_", "-")


def json_flag_values(flag: str, argv: list[str]) -> Iterator[Any]:
    """The JSON values a command line gives ``flag`` (``--flag JSON`` or ``--flag=JSON``; ``_`` for ``-`` too);
    values that are not JSON are skipped."""
    for i, arg in enumerate(argv):
        if flag_name(arg) != flag:
            continue
        eq, value = arg.partition("=")[1:]
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        try:
            yield json.loads(value)
        except ValueError:
            continue


def plugin_requested(argv: list[str] | None = None) -> bool:
    """Whether a ``vllm serve`` command line (default: this process's) asks for a freespec plugin in
    ``--speculative-config`` (JSON, or the dotted ``--speculative-config.plugin NAME``)."""
    argv = sys.argv if argv is None else argv
    if any(flag_name(arg) == "--speculative-config.plugin" for arg in argv):
        return True
    return any(is_freespec_spec(spec) for spec in json_flag_values("--speculative-config", argv))


def uses_freespec(vllm_config) -> bool:
    """Whether an engine's ``VllmConfig`` runs a freespec plugin (vLLM's ``custom_class`` with freespec's options)."""
    from freespec.vllm_plugins.frontend import ADDITIONAL_CONFIG_KEY

    spec = getattr(vllm_config, "speculative_config", None)
    additional = getattr(vllm_config, "additional_config", None)
    custom = getattr(spec, "custom_method", None)  # vLLM 0.34 moves a registered method's name here
    return ((getattr(spec, "method", None) == "custom_class" and isinstance(additional, dict)
             and ADDITIONAL_CONFIG_KEY in additional) or (isinstance(custom, str) and custom.startswith(V2_PREFIX)))
