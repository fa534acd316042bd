"""The report ``freespec doctor`` prints: vLLM version, seam probes, usable plugins."""
from __future__ import annotations


def report() -> str:
    from freespec.proposers.registry import available_plugins
    from freespec.vllm_plugins.seams import run_probes, vllm_version
    from freespec.vllm_plugins.version_gate import is_supported, supported_range_text
    from freespec.vllm_plugins.vllm_cli import installed_vllm_distribution

    version = vllm_version()
    probes = run_probes()
    usable = is_supported(version) and all(p.ok for p in probes if p.seam in ("frontend", "custom_class"))
    lines = [
        f"vLLM: {version} (distribution {installed_vllm_distribution()}); "
        f"supported range {supported_range_text()}: {'yes' if is_supported(version) else 'NO'}",
        "seams:",
    ]
    for p in probes:
        # cpu_expand_kernel reports a vLLM defect that freespec patches in each CPU worker.
        status = "ok" if p.ok else ("DEFECT, patched in workers" if p.seam == "cpu_expand_kernel" else "FAIL")
        lines.append(f"  [{status}] {p.seam}: {p.detail}")
    lines.append("plugins:")
    for name, target in sorted(available_plugins().items()):
        lines.append(f"  {name} ({target}): {'usable' if usable else 'disabled (plain decoding)'}")
    return "\n".join(lines)
