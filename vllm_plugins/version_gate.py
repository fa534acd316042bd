"""The vLLM releases freespec supports, declared once.

Outside this range freespec does not speculate: it logs one warning and vLLM
decodes plainly (slower, never wrong). CI proves every release in the range
(scripts/release_matrix.sh; docs/compatibility.md).
"""
from __future__ import annotations

import re

# Lowest supported release (inclusive) and first unsupported one (exclusive).
# 0.31.0 and 0.32.0 pass the release matrix (scripts/release_matrix.sh, docs/compatibility.md).
# 0.30.0 is out: its CPU backend kills the engine at the first verification step of any
# speculative method (vLLM's own too); the `cpu_rejection_sampler` probe says so by itself.
SUPPORTED_VLLM = ("0.31.0", "0.33.0")


def _parse(version: str) -> tuple[int, ...]:
    parts = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if parts is None:
        raise ValueError(f"unrecognised vLLM version {version!r}")
    return tuple(int(p) for p in parts.groups())


def is_supported(version: str) -> bool:
    low, high = SUPPORTED_VLLM
    try:
        return _parse(low) <= _parse(version) < _parse(high)
    except ValueError:
        return False


def supported_range_text() -> str:
    low, high = SUPPORTED_VLLM
    return f">={low},<{high}"
