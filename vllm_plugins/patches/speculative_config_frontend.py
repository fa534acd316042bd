"""Named patch ``speculative_config_frontend``: ``EngineArgs.create_speculative_config`` wrapped so that
``{"plugin": ...}`` becomes vLLM's ``custom_class`` seam (from vLLM 0.34, the registered ``freespec_<plugin>``) (``_frontend_rewrite``: validate, translate, or drop
speculation with one warning outside the supported range), and a freespec plugin's start is marked
(``installing.plugin_engine_started``). Every other speculative config passes through untouched."""
from __future__ import annotations

import functools
import logging
from typing import Any

import freespec.vllm_plugins.metrics as metrics
import freespec.vllm_plugins.probes as probes
from freespec.vllm_plugins.patches.engines import V2_PREFIX, is_freespec_spec
from freespec.vllm_plugins.patches.installing import plugin_engine_started

logger = logging.getLogger("freespec")


def install_frontend() -> None:
    """Named patch ``speculative_config_frontend`` (idempotent). A config that is not freespec's reaches vLLM
    as it was given, and nothing else of freespec's is installed for it."""
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.create_speculative_config
    if getattr(original, "_freespec", False):
        return

    @functools.wraps(original)
    def create_speculative_config(self, *args, **kwargs):
        spec = self.speculative_config
        if isinstance(spec, dict) and "plugin" in spec:
            self.speculative_config, self.additional_config = _frontend_rewrite(spec, self.additional_config)
            if self.speculative_config is not None:
                plugin_engine_started(spec["plugin"])
        elif is_freespec_spec(spec):  # vLLM's own spelling of a freespec plugin
            plugin_engine_started(_plugin_name(self.additional_config, spec))
        return original(self, *args, **kwargs)

    create_speculative_config._freespec = True  # type: ignore[attr-defined]
    EngineArgs.create_speculative_config = create_speculative_config


def _frontend_rewrite(spec: dict, additional_config: dict | None):
    """Validate and translate; outside the supported range, drop speculation with one warning."""
    from freespec.vllm_plugins.frontend import translate
    from freespec.vllm_plugins.v2.spelling import v2_speculative_config
    from freespec.vllm_plugins.version_gate import is_supported, supported_range_text, uses_v2_registry

    version = probes.vllm_version()
    # bad config: refuse to start. From vLLM 0.34 a plugin is a registered Model Runner V2 method
    # (``vllm_plugins.v2``); before, vLLM's ``custom_class``.
    if uses_v2_registry(version):
        new_spec, new_additional = v2_speculative_config(spec), additional_config
    else:
        new_spec, new_additional = translate(spec, additional_config)
    reasons = []
    if not is_supported(version):
        reasons.append(f"vLLM {version} is outside freespec's supported range {supported_range_text()}")
    broken = probes.blocking_probes(_uses_target_topk(spec["plugin"]))
    if broken:
        moved = "; ".join(f"{p.seam}: {p.detail}" for p in broken)
        reasons.append(f"a vLLM seam freespec relies on moved or is broken: {moved}")
    if reasons:
        logger.warning(
            "freespec: %s; plugin %r is disabled and vLLM decodes without speculation "
            "(output is unchanged, only not faster). Run `freespec doctor` for details.",
            "; and ".join(reasons),
            spec.get("plugin"),
        )
        metrics.refused(spec["plugin"], "seam_moved" if broken else "unsupported_vllm")
        return None, additional_config
    return new_spec, new_additional


def _uses_target_topk(plugin: str) -> bool:
    from freespec.proposers.registry import load_proposer_class

    return load_proposer_class(plugin).target_topk > 0  # translate() already checked the name


def _plugin_name(additional_config: Any, spec: Any = None) -> str:
    from freespec.vllm_plugins.frontend import ADDITIONAL_CONFIG_KEY

    method = spec.get("method") if isinstance(spec, dict) else None
    if isinstance(method, str) and method.startswith(V2_PREFIX):  # vLLM 0.34's registered spelling
        return method[len(V2_PREFIX):]
    cfg = additional_config.get(ADDITIONAL_CONFIG_KEY) if isinstance(additional_config, dict) else None
    plugin = cfg.get("plugin") if isinstance(cfg, dict) else None
    return plugin if isinstance(plugin, str) else "custom_class"
