"""Memory of a process tree, from /proc (Linux): what `freespec bench` records per server it starts."""
from __future__ import annotations

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
