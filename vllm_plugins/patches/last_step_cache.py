"""Named patch ``last_step_cache``: vLLM 0.32 never caches the KV blocks of the tokens accepted in the step
that finishes a speculative request (vLLM PR #54979 does what this does); ``Scheduler._free_request`` is
wrapped to cache a normally finished request's computed full blocks first (``cache_finished_blocks``)."""
from __future__ import annotations

import logging

import freespec.vllm_plugins.probes as probes
from freespec import settings
from freespec.vllm_plugins.patches.engines import uses_freespec
from freespec.vllm_plugins.patches.scheduler import decided_once, run_before_scheduler_method

logger = logging.getLogger("freespec")

# Methods whose drafts come from text: every KV block a finished request holds was written by the target
# model alone. Draft-model methods (eagle, draft_model, ...) keep draft KV in the same cache, possibly
# behind the target's at a request's end, so their blocks are left as vLLM leaves them.
TEXT_DRAFT_METHODS = ("ngram", "suffix", "custom_class")
# vLLM's own text-drafting methods, which get the fix only when the operator asks (FREESPEC_FIX_VLLM).
STOCK_TEXT_METHODS = ("ngram", "suffix")
# Ends after which every computed token's KV was written by a completed step: a stop token, max_tokens, and an
# abort, which is how vLLM's front-end ends a request at a stop string (the engine core takes aborts between
# steps; a step still in flight is checked for below).
FINISHED = ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED", "FINISHED_ABORTED")


def cache_finished_blocks(scheduler, request) -> bool:
    """Named patch ``last_step_cache``: put a finished request's full computed blocks in the prefix cache.

    Acts only where every computed token's KV is the target's and written: a text-drafting method, a finish
    by stop, length or abort, no KV connector (it owns the blocks' fate), no step in flight (tokens scheduled
    and not yet back, async scheduling's placeholders, deferred frees). Caches
    ``min(num_computed_tokens, num_tokens)`` tokens: rejected drafts were already subtracted from
    ``num_computed_tokens``, a stop inside the accepted tokens trims ``num_tokens``, and a preempted request
    holds no blocks and no computed tokens. Acts only in a freespec engine, or for vLLM's ``ngram`` and
    ``suffix`` where ``FREESPEC_FIX_VLLM`` names ``last_step_cache`` (``acts_in``). Returns whether it cached."""
    if not acts_in(scheduler):
        return False
    if getattr(scheduler, "connector", None) is not None or getattr(scheduler, "ec_connector", None) is not None:
        return False
    if getattr(request.status, "name", None) not in FINISHED:
        return False
    if getattr(request, "num_in_flight_tokens", 0) or getattr(request, "num_output_placeholders", 0):
        return False
    can_free = getattr(scheduler, "_request_blocks_can_be_freed", None)
    if can_free is not None and not can_free(request):
        return False
    manager = scheduler.kv_cache_manager
    if not getattr(manager, "enable_caching", False):
        return False
    manager.cache_blocks(request, min(request.num_computed_tokens, request.num_tokens))
    return True


def acts_in(scheduler) -> bool:
    """Whether ``last_step_cache`` acts in this scheduler's engine, decided once per scheduler from its
    ``vllm_config``: a freespec plugin, or vLLM's ``ngram``/``suffix`` with the operator's opt-in."""
    def decide(vllm_config) -> bool:
        method = getattr(getattr(vllm_config, "speculative_config", None), "method", None)
        return uses_freespec(vllm_config) or (
            method in STOCK_TEXT_METHODS and "last_step_cache" in settings.vllm_fixes())

    return decided_once(scheduler, "_freespec_last_step_cache", decide)


def install_last_step_cache() -> bool:
    """Wrap ``Scheduler._free_request`` when (and only when) the probe finds the defect and the seams; a no-op
    once vLLM caches the last step itself (the probe's ``absent``: the patch is retired). Returns whether it
    is installed. A failure inside the wrapper is logged once and the request is freed
    as vLLM frees it."""
    state, _ = probes.last_step_cache_state()
    if state == "fixed":
        return True
    if state != "defect":
        return False
    # the request is freed either way; only its last block stays uncached
    run_before_scheduler_method("_free_request", lambda s, r: cache_finished_blocks(s, r), "last_step_cache",
                                 "finished requests are freed as vLLM frees them")
    logger.info("freespec: a finished request's last accepted tokens now enter the prefix cache (last_step_cache)")
    return True
