"""Which patches are installed where: ``install_all`` (the general plugin, every vLLM process),
``plugin_engine_started`` (the front-end accepted a freespec plugin) and ``install_in_worker`` (the adapter, in
each worker of a freespec engine). Each patch is installed by its catalog entry's function (``catalog.PATCHES``),
unless ``FREESPEC_DISABLE_PATCHES`` names it; a failure is logged, never raised."""
from __future__ import annotations

import importlib
import logging
import os

import freespec.vllm_plugins.probes as probes
from freespec import settings
from freespec.vllm_plugins.patches import cpu_expand_kernel
from freespec.vllm_plugins.patches.catalog import PATCHES, disabled
from freespec.vllm_plugins.patches.engines import plugin_requested
from freespec.vllm_plugins.patches.logs import route_logs_to_vllm
from freespec.vllm_plugins.version_gate import uses_v2_registry

logger = logging.getLogger("freespec")


def plugin_engine_started(plugin: str) -> None:
    """The front-end accepted a freespec plugin: mark this process and the engine processes it starts
    (``settings.PLUGIN_ENGINE_ENV``), and install here what a freespec engine gets (an in-process engine core
    runs its scheduler here; a forked one inherits it)."""
    os.environ[settings.PLUGIN_ENGINE_ENV] = str(plugin)
    for name in ("prometheus_multiproc", "last_step_cache", salt_patch()):
        _install(name)


def salt_patch() -> str:
    """The patch that carries a request's scope to the drafter: ``v2_salt_route`` where V2's registry is the
    seam (vLLM >= 0.34), else ``cache_salt_scope``."""
    try:
        v2 = uses_v2_registry(probes.vllm_version())
    except Exception:  # no importable vLLM: nothing to install either way
        v2 = False
    return "v2_salt_route" if v2 else "cache_salt_scope"


def install_in_worker() -> None:
    """What a worker of a freespec engine needs, installed from the adapter's constructor (never raises).

    vLLM registers the CPU kernel overrides before it builds the worker, so the expand kernel is fixed
    here directly (``fix_cpu_expand_kernel`` re-points the registered override); where none is registered
    (GPU, Triton-CPU, a process that is no vLLM worker) this process runs no fallback and nothing is done.
    freespec's logs are routed again here: where the engine runs in the registering process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) vLLM configures its logging only after the plugins registered."""
    route_logs_to_vllm()
    if disabled("cpu_expand_kernel"):
        return
    try:
        from vllm.triton_utils import dispatcher

        if probes.EXPAND_KERNEL_NAME in getattr(dispatcher, "_registry", {}):
            cpu_expand_kernel.fix_cpu_expand_kernel()
    except Exception as e:
        logger.warning("freespec: could not install patch cpu_expand_kernel (%r); it is skipped", e)


def _install(name: str) -> None:
    """Install one patch by name unless ``FREESPEC_DISABLE_PATCHES`` names it; a failure is logged, never raised."""
    patch = next(p for p in PATCHES if p.name == name)
    if patch.install is None or disabled(name):
        return
    module, _, function = patch.install.partition(".")
    try:
        # looked up at call time in the patch's own module, so a test can stand in for one
        getattr(importlib.import_module(f"{__package__}.{module}"), function)()
    except Exception as e:
        logger.warning("freespec: could not install patch %s (%r); it is skipped", name, e)


def install_all() -> None:
    """What the general plugin does in each vLLM process; never raises.

    vLLM calls general plugins' ``register()`` unguarded (0.30 to 0.33): an exception here would stop vLLM
    from starting even without speculation. Only the front-end is installed in every process; the rest only
    for a freespec plugin (this process's command line asks for one, or the front-end marked the engine this
    process belongs to), or for vLLM's own methods as ``FREESPEC_FIX_VLLM`` asks.
    """
    route_logs_to_vllm()
    _install("speculative_config_frontend")
    fixes = settings.vllm_fixes()
    freespec_engine = settings.plugin_engine() is not None
    if freespec_engine or plugin_requested():
        _install("prometheus_multiproc")
    if freespec_engine or "last_step_cache" in fixes:
        _install("last_step_cache")
    if freespec_engine:
        _install(salt_patch())
    if "cpu_expand_kernel" in fixes:
        _install("cpu_expand_kernel")
