"""Every vLLM seam freespec relies on, declared once: where it is and what it must look like.

A seam is a list of facts about vLLM's source: a symbol in a file of the ``vllm`` package, the parameters it
takes, a field a class declares, text its source must hold. ``probes`` checks each fact against the installed
vLLM when an engine starts (by import and ``inspect``); ``source_check`` checks the same facts against a
release's source read with ``ast`` (no import), so a release that cannot be installed here is still compared
seam by seam. What only a running vLLM can show (a kernel's output, the worker a rank rule picks, which
backend runs) or only the source's structure can (the order of two calls, the arguments of one call) is one
named extra per seam, beside its side's reader (``probes.probe_<seam>``, ``source_check.check_<seam>``).

``role`` says what a moved seam costs: ``blocking`` drops speculation for every plugin, ``target_topk`` for the
plugins that use the target's top-k, ``reports`` nothing (doctor shows it), ``loaded`` is checked statically only
(without it freespec is never loaded, so no probe could run). ``v2`` seams are Model Runner V2's registry
(vLLM >= 0.34, ``version_gate.uses_v2_registry``): blocking there, where the V1-only seams (``V1_ONLY``) are not;
not used on a V1 release. ``v2_reports``: a V2 seam whose move costs no speculation (the salt route: learns nothing
across requests).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fact:
    """One fact: in ``vllm/<file>``, ``symbol`` (``"Class.name"`` or ``"name"``; empty: the module) exists;
    a ``field`` symbol is a field the class declares. Its positional parameters start with ``params`` (are
    exactly ``params`` when ``exact``), it is a classmethod if ``classmethod``, and its source holds each of
    ``holds`` (whitespace ignored), or one of the files in ``also_in`` does. ``own``: defined in the class
    itself, not inherited. ``why``: what a failure costs, added to the message that says what moved."""

    file: str
    symbol: str = ""
    field: bool = False
    params: tuple[str, ...] | None = None
    exact: bool = False
    classmethod: bool = False
    own: bool = False
    holds: tuple[str, ...] = ()
    also_in: tuple[str, ...] = ()
    why: str = ""

    @property
    def module(self) -> str:
        """The module's import name (``engine/arg_utils.py`` -> ``vllm.engine.arg_utils``)."""
        return "vllm." + self.file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


@dataclass(frozen=True)
class Seam:
    name: str
    role: str  # blocking | target_topk | reports | loaded
    facts: tuple[Fact, ...]
    ok: str  # what holds, when every fact does


GPU_RUNNER = "v1/worker/gpu_model_runner.py"
CPU_RUNNER = "v1/worker/cpu_model_runner.py"
ARG_UTILS = "engine/arg_utils.py"
PARALLEL_STATE = "distributed/parallel_state.py"
MULTIPROC = "v1/executor/multiproc_executor.py"

# Plain data the facts and the extras share.
GENERAL_PLUGINS_GROUP = "vllm.general_plugins"  # freespec's entry point group (pyproject.toml)
SPEC_CONFIG_FIELDS = ("method", "model", "num_speculative_tokens")  # SpeculativeConfig fields the front-end writes
PROPOSE_PARAMS = ("sampled_token_ids", "num_tokens_no_spec", "token_ids_cpu")  # the custom_class propose() call
EXPAND_KERNEL_NAME = "vllm.v1.sample.rejection_sampler.expand_kernel"
# What the rejection sampler's expand_kernel takes, in order (freespec's CPU replacement takes the same).
EXPAND_PARAMS = ("output", "input", "cu_num_tokens", "replace_from", "replace_to", "MAX_NUM_TOKENS")
# Metric names freespec's tests and ``freespec bench`` read (v1/spec_decode/metrics.py).
SPEC_METRICS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos",
)
# What vLLM's ``get_prometheus_registry`` must do for freespec's worker metrics to reach /metrics.
METRICS_REGISTRY_TEXT = ("PROMETHEUS_MULTIPROC_DIR", "MultiProcessCollector(")
# How vLLM numbers the workers of one engine (``initialize_model_parallel``, whitespace removed): the
# tensor-parallel rank varies fastest, then the prefill-context-parallel rank, then the pipeline stage.
RANK_LAYOUT = (
    "torch.arange(world_size).reshape(-1,data_parallel_size,pipeline_model_parallel_size,"
    "prefill_context_model_parallel_size,tensor_model_parallel_size,)"
)
# Where vLLM decides which of a request's KV blocks enter the prefix cache (``KVCacheManager.allocate_slots``):
# when it schedules a step, up to the request's known tokens, draft tokens not counted (vLLM PR #54979 changes it).
LAST_STEP_CACHE_CAP = "num_tokens_to_cache=min(total_computed_tokens+num_new_tokens,request.num_tokens,)"

# Model Runner V2 (vLLM >= 0.34): the speculator registry and what a speculator is given.
V2_SPEC = "v1/worker/gpu/spec_decode"
V2_RUNNER = "v1/worker/gpu/model_runner.py"
# ``BaseSpeculator.propose``'s leading parameters (freespec's speculators take them in this order).
V2_PROPOSE_PARAMS = ("self", "input_batch", "attn_metadata", "slot_mappings", "last_hidden_states",
                     "aux_hidden_states", "num_sampled", "num_rejected", "last_sampled", "next_prefill_tokens",
                     "temperature", "seeds")
# In ``GPUModelRunner.sample_tokens`` the sampled tokens are written to the request state before the
# speculator proposes (so the history a speculator reads is the current one).
V2_HISTORY_ORDER = ("self.postprocess_sampled(", "self.speculator.propose(")
# Seams only the V1 runner has: not blocking where V2's registry is the seam.
V1_ONLY = ("spec_config", "custom_class", "cpu_rejection_sampler", "target_topk")

NO_REGISTRY = ("this vLLM's CPU backend has no kernel-override registry: its rejection sampler keeps Triton "
               "placeholders and every speculative method, vLLM's own too, kills the engine at the first "
               "verification step")

SEAMS = (
    Seam("general_plugins", "loaded", (
        Fact("plugins/__init__.py", "load_general_plugins"),
        Fact("plugins/__init__.py", holds=(GENERAL_PLUGINS_GROUP,), why="freespec would never be loaded"),
        Fact(ARG_UTILS, "EngineArgs.__post_init__", holds=("load_general_plugins()",),
             why="the front-end would be installed too late"),
    ), f"{GENERAL_PLUGINS_GROUP} loaded by load_general_plugins(), in EngineArgs.__post_init__ too"),
    Seam("frontend", "blocking", (
        Fact(ARG_UTILS, "EngineArgs.speculative_config", field=True),
        Fact(ARG_UTILS, "EngineArgs.additional_config", field=True),
        Fact(ARG_UTILS, "EngineArgs.create_speculative_config", params=("self",), holds=("self.speculative_config",)),
        Fact("config/vllm.py", "VllmConfig.additional_config", field=True, why="options would not reach workers"),
    ), "EngineArgs.create_speculative_config + VllmConfig.additional_config"),
    Seam("spec_config", "blocking", tuple(
        Fact("config/speculative.py", f"SpeculativeConfig.{name}", field=True) for name in SPEC_CONFIG_FIELDS
    ), "SpeculativeConfig(method='custom_class', model=..., num_speculative_tokens=K)"),
    Seam("custom_class", "blocking", (
        Fact("v1/spec_decode/custom_class_proposer.py", "create_custom_proposer"),
        Fact("config/vllm.py", "VllmConfig._get_v2_model_runner_unsupported_features", holds=('"custom_class"',),
             why="custom_class left Model Runner V2's unsupported list: the V1 runner's seam may not be used"),
    ), "Class(vllm_config).propose(sampled, num_tokens_no_spec, token_ids_cpu) in the V1 runner"),
    Seam("cpu_rejection_sampler", "blocking", (
        Fact("platforms/cpu.py", "CpuPlatform.register_triton_kernel_overrides", classmethod=True, own=True,
             holds=("register_kernels", f'"{EXPAND_KERNEL_NAME}"'), why=NO_REGISTRY),
        Fact("triton_utils/dispatcher.py", "register_kernels", why=NO_REGISTRY),
    ), "C++ fallbacks registered via CpuPlatform.register_triton_kernel_overrides"),
    Seam("cpu_expand_kernel", "reports", (), "correct"),
    Seam("target_topk", "target_topk", (
        Fact(GPU_RUNNER, holds=("sample_hidden_states = hidden_states[logits_indices]",),
             why="logits rows are no longer hidden_states[logits_indices]"),
        Fact(GPU_RUNNER, holds=("self.model.compute_logits(sample_hidden_states)",),
             why="the runner no longer calls self.model.compute_logits"),
        Fact(GPU_RUNNER, holds=("self.drafter.load_model(self.model)",), also_in=(CPU_RUNNER,),
             why="load_model(target_model) no longer reaches the proposer"),
        Fact(GPU_RUNNER, "GPUModelRunner._calc_spec_decode_metadata",
             holds=("num_sampled_tokens = num_draft_tokens + 1", "np.repeat("),
             why="logits_indices no longer hold 1 + num_draft_tokens rows per request"),
    ), "compute_logits rows: 1 + drafts per request, in batch order"),
    Seam("spec_metrics", "reports", (
        Fact("v1/spec_decode/metrics.py", holds=tuple(f'"{m}"' for m in SPEC_METRICS),
             why="metric(s) renamed or gone"),
    ), ", ".join(m.removeprefix("vllm:") for m in SPEC_METRICS)),
    Seam("metrics_registry", "reports", (
        Fact("v1/metrics/prometheus.py", "get_prometheus_registry", holds=METRICS_REGISTRY_TEXT,
             why="freespec's worker metrics would not reach /metrics"),
    ), "with PROMETHEUS_MULTIPROC_DIR set, /metrics collects every vLLM process's metrics (freespec's from the "
       "workers)"),
    Seam("vllm_cli", "reports", (
        Fact("entrypoints/cli/main.py", "main", params=(), exact=True),
    ), "entrypoints.cli.main:main()"),
    Seam("draft_rank", "reports", (
        Fact(PARALLEL_STATE, "model_parallel_is_initialized"),
        Fact(PARALLEL_STATE, "get_tp_group"),
        Fact(PARALLEL_STATE, "get_pcp_group"),
        Fact(PARALLEL_STATE, "initialize_model_parallel", holds=(RANK_LAYOUT,),
             why="the worker rank layout changed (TP rank no longer varies fastest)"),
        Fact(MULTIPROC, "MultiprocExecutor._get_output_rank"),
        Fact(MULTIPROC, "MultiprocExecutor.take_draft_token_ids", holds=("unique_reply_rank=self.output_rank",),
             why="MultiprocExecutor no longer takes drafts from its output rank only"),
        Fact("v1/executor/abstract.py", "Executor.take_draft_token_ids", holds=("output[0]",),
             why="Executor.take_draft_token_ids no longer keeps worker 0's reply"),
    ), "drafts are taken from TP rank 0 (PCP rank 0) of the last pipeline stage"),
    Seam("request_ids", "reports", (
        Fact("v1/worker/gpu_input_batch.py", "InputBatch.req_ids", why="requests are told apart by a fingerprint"),
    ), "each row's request id is read from the runner's input_batch.req_ids"),
    Seam("cache_salt", "reports", (
        Fact("v1/core/sched/scheduler.py", "Scheduler.add_request", params=("self", "request")),
        Fact("v1/request.py", "Request.__init__", holds=("self.cache_salt", "self.sampling_params=sampling_params"),
             why="the request's cache_salt cannot be carried to the worker"),
        Fact("sampling_params.py", holds=("extra_args:dict[str,Any]|None",),
             why="SamplingParams carries no extra_args to the worker"),
        Fact("v1/core/sched/output.py", "NewRequestData.sampling_params", field=True,
             why="the sampling params no longer reach the worker"),
        Fact("v1/worker/gpu_input_batch.py", "CachedRequestState.sampling_params", field=True,
             why="the worker keeps no sampling params per request"),
    ), "Scheduler.add_request(request): request.cache_salt, hashed, rides in sampling_params.extra_args to the "
       "worker's CachedRequestState"),
    Seam("last_step_cache", "reports", (
        Fact("v1/core/sched/scheduler.py", "Scheduler._free_request", params=("self", "request")),
        Fact("v1/core/kv_cache_manager.py", "KVCacheManager.cache_blocks",
             params=("self", "request", "num_computed_tokens"), exact=True),
    ), "the seams patch last_step_cache wraps"),
    Seam("step_times", "reports", (
        Fact(GPU_RUNNER, "GPUModelRunner.execute_model", params=("self", "scheduler_output")),
        Fact(GPU_RUNNER, "GPUModelRunner.sample_tokens", params=("self",), holds=("self.propose_draft_token_ids(",),
             why="the drafter is no longer called inside sample_tokens"),
        Fact(GPU_RUNNER, "GPUModelRunner.propose_draft_token_ids", params=("self",)),
        Fact("v1/core/sched/output.py", "SchedulerOutput.total_num_scheduled_tokens", field=True),
        Fact("v1/core/sched/output.py", "SchedulerOutput.num_scheduled_tokens", field=True),
    ), "execute_model(scheduler_output), then sample_tokens() calling propose_draft_token_ids() (the "
       "diagnosis patch step_times times each)"),
)
SEAMS += (
    Seam("v2_registry", "v2", (
        Fact(f"{V2_SPEC}/speculator_config.py", "register_speculative_method", params=("name", "config_cls"),
             exact=True, why="freespec's plugins cannot be registered as methods"),
        Fact(f"{V2_SPEC}/speculator_config.py", "SpeculatorConfig.configure", params=("cls", "spec"),
             classmethod=True),
        Fact(f"{V2_SPEC}/speculator_config.py", "SpeculatorConfig.apply_options", params=("cls", "spec"),
             classmethod=True, why="speculator_options would not be checked at config time"),
        Fact(f"{V2_SPEC}/speculator_config.py", holds=("base_method:", "speculator_class:", "supported_options:")),
        Fact("config/speculative.py", "SpeculativeConfig.speculator_options", field=True),
        Fact("config/speculative.py", "SpeculativeConfig.__post_init__",
             holds=("get_custom_speculator_config_class(self.method)", "config_cls.apply_options(self)")),
        Fact(f"{V2_SPEC}/__init__.py", "init_speculator", holds=("req_states=req_states",),
             why="the speculator is no longer given the request state"),
    ), "register_speculative_method(name, SpeculatorConfig subclass) with speculator_options, checked by "
       "apply_options; init_speculator(vllm_config, device, req_states=...)"),
    Seam("v2_propose", "v2", (
        Fact(f"{V2_SPEC}/speculator.py", "BaseSpeculator.propose", params=V2_PROPOSE_PARAMS),
        Fact(f"{V2_SPEC}/speculator.py", "BaseSpeculator.add_request", params=("self", "req_index"), exact=True),
        Fact(f"{V2_SPEC}/speculator.py", "BaseSpeculator.on_requests_finished", params=("self", "finished_req_ids"),
             exact=True),
        Fact(f"{V2_SPEC}/speculator.py", "BaseSpeculator.reset_state", params=("self",), exact=True),
        Fact(V2_RUNNER, "GPUModelRunner.sample_tokens", holds=V2_HISTORY_ORDER),
    ), "BaseSpeculator.propose(input_batch, ..., num_sampled, num_rejected, last_sampled, ...) -> drafts "
       "[num_reqs, K], after the sampled tokens are written; add_request, on_requests_finished, reset_state"),
    Seam("v2_token_history", "v2", (
        Fact("v1/worker/gpu/states.py", "RequestState.__init__",
             holds=("self.all_token_ids=StagedWriteTensor(", "self.total_len=StagedWriteTensor(",
                    "self.req_id_to_index", "self.last_sampled_tokens"),
             why="a speculator cannot read a request's tokens"),
        *(Fact("v1/worker/gpu/input_batch.py", f"InputBatch.{name}", field=True)
          for name in ("req_ids", "num_reqs", "idx_mapping", "idx_mapping_np")),
    ), "RequestState.all_token_ids / total_len / last_sampled_tokens rows, by InputBatch.idx_mapping"),
    Seam("v2_salt_route", "v2_reports", (
        Fact("v1/core/sched/scheduler.py", "Scheduler.add_request", params=("self", "request")),
        Fact("v1/request.py", "Request.__init__", holds=("self.cache_salt",)),
        Fact("v1/core/sched/output.py", "NewRequestData.sampling_params", field=True),
        Fact(V2_RUNNER, "GPUModelRunner.add_requests",
             holds=("self.speculator.add_request(req_index)", "new_req_data.sampling_params"),
             why="the worker no longer sees a new request's sampling params beside the speculator's add_request"),
    ), "request.cache_salt, hashed into sampling_params.extra_args by the scheduler, reaches "
       "GPUModelRunner.add_requests after speculator.add_request(req_index) (patch v2_salt_route)"),
)
BY_NAME = {s.name: s for s in SEAMS}
# Probes whose failure disables every plugin (target_topk: only plugins that use it).
BLOCKING = tuple(s.name for s in SEAMS if s.role == "blocking")
# The same where V2's registry is the seam: its own seams, and the V1 ones it still uses (the front-end).
BLOCKING_V2 = tuple(s.name for s in SEAMS if s.role in ("blocking", "v2") and s.name not in V1_ONLY)


def blocking_seams(v2: bool) -> tuple[str, ...]:
    """The seams whose move drops speculation for every plugin, where V2's registry (``v2``) or V1 is the seam."""
    return BLOCKING_V2 if v2 else BLOCKING


def squeeze(text: str) -> str:
    """Text without whitespace: how source is compared (formatting changes move nothing)."""
    return "".join(text.split())
