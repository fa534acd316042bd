"""Every named patch freespec applies to vLLM, listed in ``PATCHES``; each is idempotent and never raises.

A guest in vLLM's processes changes only the engines that invited it. freespec's general plugin runs in every
vLLM process once the package is installed, so ``install_all`` installs only the front-end there, which passes
every config that is not freespec's through untouched. The other patches act only in engines that run a
freespec plugin: the front-end marks such a start (``settings.PLUGIN_ENGINE_ENV``, inherited by the engine's
processes) and the adapter installs what its workers need (``install_in_worker``). The two that fix vLLM
defects (``VLLM_FIXES``) may also be turned on for vLLM's own methods by the operator (``FREESPEC_FIX_VLLM``);
each names its upstream report and retires itself through its probe the day vLLM ships the fix.
``FREESPEC_DISABLE_PATCHES`` names patches not to apply (diagnosis only); ``freespec doctor`` shows each
patch's state (``patch_states``).

One module per patch: ``speculative_config_frontend`` (the front-end; ``_frontend_rewrite`` translates a
``{"plugin": ...}`` config), ``prometheus_multiproc``, ``cpu_expand_kernel``, ``last_step_cache`` and
``cache_salt_scope`` (both through ``scheduler``'s wrapper), and on vLLM >= 0.34 ``v2_salt_route`` in place of
``cache_salt_scope`` (``installing.salt_patch``). The others named in ``PATCHES`` live beside the
code they serve: ``request_ids``, ``target_topk``, ``vllm_cli`` and ``step_timer``. Around them: ``catalog``
(the table), ``engines`` (which engines and command lines ask for freespec), ``installing`` (what is installed
where), ``logs`` and ``states`` (what doctor shows). The names below are the ones importers use.
"""
from __future__ import annotations

from freespec.vllm_plugins.patches.cache_salt_scope import install_cache_salt_scope, stamp_scope
from freespec.vllm_plugins.patches.catalog import PATCHES, VLLM_FIXES, Patch, disabled, patch_names
from freespec.vllm_plugins.patches.cpu_expand_kernel import (
    expand_kernel_reference,
    fix_cpu_expand_kernel,
    install_cpu_expand_fix,
)
from freespec.vllm_plugins.patches.engines import (
    flag_name,
    is_freespec_spec,
    json_flag_values,
    plugin_requested,
    uses_freespec,
)
from freespec.vllm_plugins.patches.installing import install_all, install_in_worker, plugin_engine_started
from freespec.vllm_plugins.patches.last_step_cache import (
    FINISHED,
    STOCK_TEXT_METHODS,
    TEXT_DRAFT_METHODS,
    acts_in,
    cache_finished_blocks,
    install_last_step_cache,
)
from freespec.vllm_plugins.patches.logs import route_logs_to_vllm
from freespec.vllm_plugins.patches.prometheus_multiproc import install_prometheus_multiproc
from freespec.vllm_plugins.patches.speculative_config_frontend import _frontend_rewrite, install_frontend
from freespec.vllm_plugins.patches.states import patch_states
from freespec.vllm_plugins.patches.v2_salt_route import install_v2_salt_route

__all__ = [
    "FINISHED", "PATCHES", "STOCK_TEXT_METHODS", "TEXT_DRAFT_METHODS", "VLLM_FIXES", "Patch", "_frontend_rewrite",
    "acts_in", "cache_finished_blocks", "disabled", "expand_kernel_reference", "fix_cpu_expand_kernel",
    "flag_name", "install_all", "install_cache_salt_scope", "install_cpu_expand_fix", "install_frontend",
    "install_in_worker", "install_last_step_cache", "install_prometheus_multiproc", "install_v2_salt_route",
    "is_freespec_spec", "json_flag_values", "patch_names", "patch_states", "plugin_engine_started",
    "plugin_requested", "route_logs_to_vllm", "stamp_scope", "uses_freespec",
]
