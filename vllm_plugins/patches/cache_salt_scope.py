"""Named patch ``cache_salt_scope``: vLLM 0.32 keeps a request's ``cache_salt`` in the engine core, where the
worker that drafts never sees it; ``Scheduler.add_request`` is wrapped to write each request's scope into its
sampling params' ``extra_args`` (``stamp_scope``), which reach the worker."""
from __future__ import annotations

import freespec.vllm_plugins.probes as probes
from freespec.vllm_plugins.patches.engines import uses_freespec
from freespec.vllm_plugins.patches.scheduler import decided_once, run_before_scheduler_method
from freespec.vllm_plugins.request_ids import SCOPE_ARG, scope_of


def stamp_scope(scheduler, request) -> bool:
    """Named patch ``cache_salt_scope``: write the request's scope (``request_ids.scope_of`` its ``cache_salt``)
    into a fresh copy of its sampling params' ``extra_args``, which vLLM sends to the worker with the request.
    Any value a client put under that key is overwritten, so a request cannot name another tenant's scope.
    Acts only in a freespec engine (``uses_freespec``, decided once per scheduler). Returns whether it wrote."""
    acts = decided_once(scheduler, "_freespec_scope", uses_freespec)
    params = getattr(request, "sampling_params", None)
    if not acts or params is None:
        return False
    extra = dict(params.extra_args or {})  # a copy: the dict may be shared with the caller's params
    extra[SCOPE_ARG] = scope_of(getattr(request, "cache_salt", None))
    params.extra_args = extra
    return True


def install_cache_salt_scope() -> bool:
    """Wrap ``Scheduler.add_request`` where the probe finds the seams (idempotent). A failure inside the wrapper
    is logged once; the request is added as vLLM adds it, and its rows learn nothing across requests."""
    if not probes.probe_cache_salt().ok:
        return False
    run_before_scheduler_method("add_request", lambda s, r: stamp_scope(s, r), "cache_salt_scope",
                                 "such requests learn nothing across requests")
    return True
