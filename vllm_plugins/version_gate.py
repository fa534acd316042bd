"""The vLLM releases freespec supports, declared once.

Outside this range freespec does not speculate: it logs one warning and vLLM
decodes plainly (slower, never wrong). CI proves every release in the range.
"""
from __future__ import annotations

import re

# Lowest supported release (inclusive) and first unsupported one (exclusive).
SUPPORTED_VLLM = ("0.32.0", "0.33.0")


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
