"""The report ``freespec doctor`` prints: vLLM version, each seam probe by name, usable plugins.

Which plugins are usable is decided exactly as the front-end decides it at
engine start (``version_gate.is_supported`` and ``seams.blocking_probes``), so
the report and vLLM's behaviour cannot disagree.
"""
from __future__ import annotations


def _status(probe, expand_hook: bool) -> str:
    from freespec.vllm_plugins.seams import BLOCKING

    if probe.ok:
        return "ok"
    if probe.seam == "cpu_expand_kernel":  # a vLLM defect freespec patches in each CPU worker
        return "DEFECT, patched in workers" if expand_hook else "DEFECT, not patched (no override hook)"
    if probe.seam in BLOCKING:
        return "FAIL"
    if probe.seam == "target_topk":
        return "FAIL (plugins using target top-k)"
    if probe.seam == "draft_rank":  # safe fallback: correct, only each TP rank pays for a proposer
        return "WARN, every TP rank builds its proposer"
    return "WARN"


def report() -> str:
    from freespec.proposers.registry import available_plugins, load_proposer_class
    from freespec.vllm_plugins.seams import blocking_probes, cpu_kernel_override_hook, run_probes, vllm_version
    from freespec.vllm_plugins.version_gate import is_supported, supported_range_text
    from freespec.vllm_plugins.vllm_cli import installed_vllm_distribution

    version = vllm_version()
    supported = is_supported(version)
    probes = run_probes()
    expand_hook = cpu_kernel_override_hook() is not None
    lines = [
        f"vLLM: {version} (distribution {installed_vllm_distribution()}); "
        f"supported range {supported_range_text()}: {'yes' if supported else 'NO'}",
        "seams:",
    ]
    for p in probes:
        lines.append(f"  [{_status(p, expand_hook)}] {p.seam}: {p.detail}")
    lines.append("plugins:")
    for name, target in sorted(available_plugins().items()):
        try:
            uses_topk = load_proposer_class(name).target_topk > 0
        except Exception as e:  # a plugin that cannot even be imported
            lines.append(f"  {name} ({target}): disabled (cannot load: {e!r})")
            continue
        why = [] if supported else ["vLLM version outside the supported range"]
        why += [p.seam for p in blocking_probes(uses_topk, probes)]
        state = "usable" if not why else "disabled, vLLM decodes plainly: " + ", ".join(why)
        lines.append(f"  {name} ({target}): {state}")
    return "\n".join(lines)
