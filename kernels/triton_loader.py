"""The one place the kernels import Triton: lazily, on first use, and only when wanted.

CPU-only callers never import triton or pay for it, and importing a kernel module leaves the choice of
Triton's interpreter mode to whoever imports triton first. Kernels are plain functions decorated on first
use (``jit``), not at import: Triton decides at decoration time whether a kernel is compiled or interpreted
(``TRITON_INTERPRET``), so a test can switch the interpreter on after importing a kernel module.
"""
from __future__ import annotations

import os
from typing import Any, MutableMapping

from freespec.settings import force_triton

_JITTED: dict = {}


def bind(namespace: MutableMapping[str, Any]) -> bool:
    """Import triton into a kernel module's globals (``triton``, ``tl``) on first call; whether it imported.

    The kernels' bodies name ``tl`` as a module global, which is why the modules are bound, not returned.
    A failed import is remembered in the namespace, so it is tried once per module.
    """
    if namespace.get("triton") is None and not namespace.get("_TRITON_MISSING"):
        try:
            import triton
            import triton.language as tl
        except ImportError:
            namespace["_TRITON_MISSING"] = True
            return False
        namespace["triton"], namespace["tl"] = triton, tl
    return namespace.get("triton") is not None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def jit(fn):
    """``triton.jit(fn)``, once per interpreter setting (read at decoration time, so decorate lazily)."""
    key = (fn, interpreting())
    if key not in _JITTED:
        import triton

        _JITTED[key] = triton.jit(fn)
    return _JITTED[key]


def wanted(tensor: Any) -> bool:
    """Triton for CUDA tensors; for any torch tensor with ``FREESPEC_FORCE_TRITON=1`` (tests)."""
    import torch

    return isinstance(tensor, torch.Tensor) and (tensor.is_cuda or force_triton())
