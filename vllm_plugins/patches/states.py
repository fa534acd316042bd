"""What ``freespec doctor`` shows of each patch: its state from the probes' results (``patch_states``)."""
from __future__ import annotations

import freespec.vllm_plugins.probes as probes
from freespec import settings
from freespec.vllm_plugins.patches.catalog import PATCHES, VLLM_FIXES
from freespec.vllm_plugins.patches.installing import salt_patch


def patch_states(results: dict[str, probes.ProbeResult], env: dict[str, str] | None = None) -> list[dict[str, str]]:
    """Each patch's state from the probes' results (by seam): ``acting`` (in freespec engines; for a fix, also
    in vLLM's own methods when opted in), ``opt-in off`` (a fix not asked for vLLM's own methods), ``diagnosis only``
    (``step_times``: installed by a script only), ``retired``
    (vLLM fixed the defect), ``not needed`` (not this platform), ``seam moved`` or ``disabled``."""
    off = settings.disabled_patches(env)
    fixes = settings.vllm_fixes(env)
    out = []
    for patch in PATCHES:
        probe = results.get(patch.probe)
        state = _state(patch.name, probe)
        stock = ""
        if patch.name in VLLM_FIXES:
            stock = "acting" if patch.name in fixes and state == "acting" else (
                "opt-in off" if state == "acting" else state)
        if patch.name in off:
            state = stock = "disabled"
        out.append({"name": patch.name, "state": state, "vllm_methods": stock, "applied_by": patch.applied_by,
                    "upstream": patch.upstream, "what": patch.what})
    return out


def _state(name: str, probe: probes.ProbeResult | None) -> str:
    if name == "step_times":  # never in an engine a user starts
        return "seam moved" if probe is not None and not probe.ok else "diagnosis only"
    if probe is None:
        return "acting"
    if name == "last_step_cache":
        return {"defect": "acting", "fixed": "acting", "absent": "retired"}.get(probe.state, "seam moved")
    if name == "cpu_expand_kernel":
        if probe.detail == probes.FIXED_BY_FREESPEC or not probe.ok:
            return "acting" if probes.cpu_kernel_override_hook() is not None else "seam moved"
        return "retired" if probe.detail == "correct" else "not needed"
    if name == "v2_salt_route" and probe.detail == probes.NOT_THIS_RUNNER:
        return "not needed"  # a V1 release: cache_salt_scope carries the scope
    if name == "cache_salt_scope" and salt_patch() == "v2_salt_route":
        return "not needed"  # V2's registry is the seam: v2_salt_route carries the scope
    if name == "vllm_cli_version":
        return "not needed" if probe.ok else "acting"
    return "acting" if probe.ok else "seam moved"
