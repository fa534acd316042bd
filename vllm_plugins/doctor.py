"""The report ``freespec doctor`` prints: vLLM version, the machine, each seam probe by name, usable plugins.

Which plugins are usable is decided exactly as the front-end decides it at
engine start (``version_gate.is_supported`` and ``probes.blocking_probes``), so
the report and vLLM's behaviour cannot disagree. ``diagnose`` gives the same
facts as data (``freespec doctor --json``), for scripts and bug reports.
"""
from __future__ import annotations

from typing import Any


def _status(probe, expand_hook: bool) -> str:
    from freespec.vllm_plugins.probes import BLOCKING

    if probe.ok:
        return "ok"
    if probe.seam == "cpu_expand_kernel":  # a vLLM defect freespec patches in each CPU worker
        return "DEFECT, patched in workers" if expand_hook else "DEFECT, not patched (no override hook)"
    if probe.seam == "vllm_cli":  # a vLLM defect freespec's own command works around
        return "DEFECT, use `freespec serve`"
    if probe.seam in BLOCKING:
        return "FAIL"
    if probe.seam == "target_topk":
        return "FAIL (plugins using target top-k)"
    if probe.seam == "draft_rank":  # safe fallback: correct, only each TP rank pays for a proposer
        return "WARN, every TP rank builds its proposer"
    if probe.seam == "request_ids":  # safe fallback: requests keyed by a fingerprint of their tokens
        return "WARN, requests told apart by their tokens"
    return "WARN"


def diagnose() -> dict[str, Any]:
    """freespec's and vLLM's versions, the machine (with how to set up vLLM's CPU worker where that is measured to
    make it faster: ``freespec.machine.cpu_advice``), every probe with its status, and each plugin's state."""
    from freespec import __version__
    from freespec.machine import cpu_advice, describe_machine
    from freespec.proposers.registry import available_plugins, load_proposer_class
    from freespec.vllm_plugins.probes import (
        blocking_probes,
        cpu_kernel_override_hook,
        run_probes,
        vllm_version,
    )
    from freespec.vllm_plugins.version_gate import is_supported, supported_range_text
    from freespec.vllm_plugins.vllm_cli import installed_vllm_distribution

    version = vllm_version()
    supported = is_supported(version)
    probes = run_probes()
    expand_hook = cpu_kernel_override_hook() is not None
    machine = describe_machine()
    plugins = []
    for name, target in sorted(available_plugins().items()):
        entry: dict[str, Any] = {"name": name, "target": target}
        try:
            uses_topk = load_proposer_class(name).target_topk > 0
        except Exception as e:  # a plugin that cannot even be imported
            plugins.append({**entry, "usable": False, "reasons": [f"cannot load: {e!r}"]})
            continue
        why = [] if supported else ["vLLM version outside the supported range"]
        why += [p.seam for p in blocking_probes(uses_topk, probes)]
        plugins.append({**entry, "usable": not why, "reasons": why})
    return {
        "freespec": __version__,
        "vllm": {"version": version, "distribution": installed_vllm_distribution(),
                 "supported_range": supported_range_text(), "supported": supported},
        "machine": machine,
        "advice": cpu_advice(machine),
        "seams": [{"seam": p.seam, "ok": p.ok, "status": _status(p, expand_hook), "detail": p.detail}
                  for p in probes],
        "plugins": plugins,
    }


def report(data: dict[str, Any] | None = None) -> str:
    """``diagnose()`` as the text ``freespec doctor`` prints."""
    from freespec.machine import machine_summary

    data = diagnose() if data is None else data
    v = data["vllm"]
    lines = [
        f"freespec: {data['freespec']}",
        (f"vLLM: {v['version']} (distribution {v['distribution']}); "
         f"supported range {v['supported_range']}: {'yes' if v['supported'] else 'NO'}"),
        f"machine: {machine_summary(data['machine'])}",
    ]
    lines += [f"  note: {a}" for a in data["advice"]]
    lines.append("seams:")
    lines += [f"  [{s['status']}] {s['seam']}: {s['detail']}" for s in data["seams"]]
    lines.append("plugins:")
    for p in data["plugins"]:
        if p["usable"]:
            state = "usable"
        elif p["reasons"] and p["reasons"][0].startswith("cannot load"):
            state = "disabled (" + p["reasons"][0] + ")"
        else:
            state = "disabled, vLLM decodes plainly: " + ", ".join(p["reasons"])
        lines.append(f"  {p['name']} ({p['target']}): {state}")
    return "\n".join(lines)
