"""Named patch ``v2_salt_route``: a request's ``cache_salt`` scope carried to a Model Runner V2 speculator
(vLLM >= 0.34), whose worker keeps no sampling params per request.

Two halves, installed together in each process of a freespec engine (``installing``): the scheduler's
``add_request`` writes each request's scope into its sampling params' ``extra_args`` (``cache_salt_scope``'s
``stamp_scope``: a one-way hash of the salt, overwriting any value a client sent), which vLLM sends to the
worker in ``NewRequestData``; and ``GPUModelRunner.add_requests`` is wrapped to hand each new request's scope
to the speculator's ``v2.scopes.SlotScopes`` by slot, once vLLM has given the request its slot and called
the speculator's ``add_request``. The salt itself never reaches the worker.
"""
from __future__ import annotations

import functools
import logging

import freespec.vllm_plugins.probes as probes
from freespec.vllm_plugins.patches.cache_salt_scope import stamp_scope
from freespec.vllm_plugins.patches.scheduler import run_before_scheduler_method
from freespec.vllm_plugins.request_ids import SCOPE_ARG
from freespec.vllm_plugins.v2.scopes import SCOPES_ATTRIBUTE, SlotScopes

logger = logging.getLogger("freespec")
CONSEQUENCE = "such requests learn nothing across requests"


def stamped_scope(new_req_data) -> object:
    """The scope the scheduler wrote into a new request's sampling params (None where there is none)."""
    params = getattr(new_req_data, "sampling_params", None)
    extra = getattr(params, "extra_args", None)
    return extra.get(SCOPE_ARG) if isinstance(extra, dict) else None


def route_scopes(runner, scheduler_output) -> int:
    """Hand each request ``scheduler_output`` added to ``runner`` its scope, in the speculator's ``SlotScopes``
    (``SlotScopes.assign`` keeps only a value ``request_ids.scope_of`` can give). Nothing where the runner's
    speculator holds none (not a freespec engine). Returns the slots assigned."""
    scopes = getattr(getattr(runner, "speculator", None), SCOPES_ATTRIBUTE, None)
    if not isinstance(scopes, SlotScopes):
        return 0
    slots = runner.req_states.req_id_to_index
    done = 0
    for new in scheduler_output.scheduled_new_reqs:
        slot = slots.get(new.req_id)
        if slot is not None:
            scopes.assign(slot, stamped_scope(new))
            done += 1
    return done


def route_installed() -> bool:
    """Whether the worker's half is in force in this process (else ``"scope": "salt"`` learns nothing across
    requests here)."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    return bool(getattr(GPUModelRunner.add_requests, "_freespec", False))


def install_v2_salt_route() -> bool:
    """Install both halves where the probe finds the seams (idempotent). A failure inside either is logged
    once; vLLM's own method runs as without freespec, and the request's slot keeps no tenant's scope (the
    speculator's ``add_request`` reset it): it learns nothing across requests."""
    result = probes.probe_v2_salt_route()
    if not result.ok or result.detail == probes.NOT_THIS_RUNNER:  # moved, or a V1 release (cache_salt_scope's)
        return False
    run_before_scheduler_method("add_request", lambda s, r: stamp_scope(s, r), "v2_salt_route", CONSEQUENCE)
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    original = GPUModelRunner.add_requests
    if getattr(original, "_freespec", False):
        return True
    failed = []

    @functools.wraps(original)
    def add_requests(self, scheduler_output, *args, **kwargs):
        out = original(self, scheduler_output, *args, **kwargs)
        try:
            route_scopes(self, scheduler_output)
        except Exception as e:
            if not failed:
                failed.append(e)
                logger.warning("freespec: patch v2_salt_route failed (%r); %s", e, CONSEQUENCE)
        return out

    add_requests._freespec = True  # type: ignore[attr-defined]
    GPUModelRunner.add_requests = add_requests
    return True
