"""The report ``freespec doctor`` prints: vLLM version, the machine, each seam probe by name, each patch with its
state (``patches.patch_states``), usable plugins, and the plugins other packages install (``third_party_plugins``).

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
        return "DEFECT, patched in freespec engines" if expand_hook else "DEFECT, not patched (no override hook)"
    if probe.seam == "last_step_cache":  # a vLLM defect freespec patches in the engine's scheduler
        return "DEFECT, patched in freespec engines" if probe.state == "defect" else "WARN, not patched"
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


def _entry_points():
    from importlib.metadata import entry_points

    from freespec.proposers.registry import GROUP

    return entry_points(group=GROUP)


def _own_distribution(name: str) -> bool:
    return name.lower().replace("_", "-") == "vllm-freespec"


def third_party_plugins() -> list[dict[str, Any]]:
    """Plugins other distributions register in the ``freespec.proposers`` entry-point group: each one's name,
    class path, distribution and version, whether it loads as a concrete Proposer (the checks a speculative
    config gets), and a dry validation of its default options (``Options()``; fields without a default are
    reported as ``needs``, not as a failure: the operator gives them)."""
    from pydantic import ValidationError

    from freespec.proposers.registry import load_proposer_class

    found = []
    for ep in sorted(_entry_points(), key=lambda e: (e.name, e.value)):
        dist = getattr(ep, "dist", None)
        name = dist.metadata["Name"] if dist is not None else "unknown"
        if _own_distribution(name):
            continue
        entry: dict[str, Any] = {"name": ep.name, "target": ep.value, "distribution": name,
                                 "version": dist.version if dist is not None else "unknown",
                                 "loads": False, "valid": False, "needs": [], "error": None}
        try:
            cls = load_proposer_class(ep.value)  # by its class path: the entry point's own target
        except Exception as e:
            found.append({**entry, "error": str(e)})
            continue
        entry["loads"] = True
        try:
            cls.Options.model_validate({})
            entry["valid"] = True
        except ValidationError as e:
            missing = [".".join(str(p) for p in err["loc"]) for err in e.errors() if err["type"] == "missing"]
            entry["valid"] = len(missing) == len(e.errors())
            entry["needs"] = missing
            if not entry["valid"]:
                entry["error"] = f"default options invalid: {e.errors()[0]['msg']}"
        except Exception as e:  # an Options class whose own code raises
            entry["error"] = f"default options invalid: {type(e).__name__}: {e}"
        found.append(entry)
    return found


def _third_party_line(p: dict[str, Any]) -> str:
    where = f"{p['name']} ({p['target']}) from {p['distribution']} {p['version']}"
    if not p["loads"]:
        return f"  {where}: FAILS to load: {p['error']}"
    if not p["valid"]:
        return f"  {where}: loads; FAILS dry validation: {p['error']}"
    needs = f" (needs options: {', '.join(p['needs'])})" if p["needs"] else ""
    return f"  {where}: loads, options valid{needs}"


def metrics_export(env: dict[str, str] | None = None) -> dict[str, Any]:
    """Whether freespec's worker metrics reach ``/metrics`` of a server started from this shell, and the fix if not.

    ``ok`` False comes with ``fix`` (``metrics.MULTIPROC_FIX``). The general plugin sets the variable itself in the
    API server of ``vllm serve`` when vLLM loads general plugins while it builds its parser
    (``AsyncEngineArgs.add_cli_args``), before any metric exists (checked again at start, with a warning).
    """
    import importlib.util
    import inspect
    import os

    from freespec import settings
    from freespec.vllm_plugins.metrics import MULTIPROC_ENV, MULTIPROC_FIX

    env = dict(os.environ) if env is None else env
    if not settings.metrics_enabled(env):
        return {"ok": True, "detail": "off (turned off in this environment)", "fix": None}
    if importlib.util.find_spec("prometheus_client") is None:
        return {"ok": True, "detail": "off (no prometheus_client)", "fix": None}
    if env.get(MULTIPROC_ENV):
        return {"ok": True, "detail": f"{MULTIPROC_ENV}={env[MULTIPROC_ENV]} is set here: a server started from this "
                "shell collects them (use a fresh directory for each start)", "fix": None}
    if "prometheus_multiproc" in settings.disabled_patches(env):
        return {"ok": False, "detail": "patch prometheus_multiproc is disabled here: freespec:* stay out of "
                "/metrics", "fix": MULTIPROC_FIX}
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs

        early = "load_general_plugins" in inspect.getsource(AsyncEngineArgs.add_cli_args)
    except Exception:  # no vLLM, or a layout without it
        early = False
    if early:
        return {"ok": True, "detail": "freespec serve and vllm serve with a freespec plugin export freespec:* on "
                f"/metrics (the plugin sets {MULTIPROC_ENV} in vLLM's API server); with another launcher run "
                f"`{MULTIPROC_FIX}` first",
                "fix": None}
    return {"ok": False, "detail": "this vLLM does not load plugins before its API server's metrics: with vllm "
            "serve freespec:* stay out of /metrics (freespec serve exports them)", "fix": MULTIPROC_FIX}


# vLLM's choice between its model runners (vllm/config/vllm.py): V2 is the default where Triton runs (the CUDA
# wheels, 0.29 and later) except for features it lacks, custom_class among them.
RUNNER_V2_ENV = "VLLM_USE_V2_MODEL_RUNNER"


def model_runner(distribution: str | None) -> dict[str, Any] | None:
    """On a GPU build (distribution ``vllm``): which model runner a freespec plugin runs on. None elsewhere.

    Model Runner V2 does not take ``custom_class``; vLLM then uses the V1 runner with a warning ("Model Runner
    V2 does not yet support speculative method 'custom_class'"), as for its own ``suffix`` and ``ngram``
    (``VLLM_USE_V2_MODEL_RUNNER=1`` makes such a start fail instead).
    """
    if distribution != "vllm":
        return None
    import inspect

    from freespec.vllm_plugins.probes import vllm_version
    from freespec.vllm_plugins.version_gate import uses_v2_registry

    if uses_v2_registry(vllm_version()):
        return {"v2_default": True, "detail": "Model Runner V2 only: each plugin is the registered method "
                "freespec_<plugin> (--speculative-config '{\"method\": \"freespec_hybrid\", ...}'), drafting on "
                "the host, one sync a step (docs/architecture.md)"}
    try:
        from vllm.config.vllm import VllmConfig

        unsupported = inspect.getsource(VllmConfig._get_v2_model_runner_unsupported_features)
    except Exception:  # before Model Runner V2, or moved
        return {"v2_default": False, "detail": "no Model Runner V2 here: plugins run on vLLM's model runner"}
    if '"custom_class"' not in unsupported:
        return {"v2_default": True, "detail": "Model Runner V2 no longer lists custom_class as unsupported: "
                "check that plugins still draft (`freespec bench`)"}
    return {"v2_default": True, "detail": "Model Runner V2 is vLLM's default here and does not take custom_class: "
            "with a freespec plugin vLLM falls back to the V1 runner, with a warning (as for its own suffix and "
            f"ngram); {RUNNER_V2_ENV}=1 makes that start fail. Compare no speculation on both runners "
            "(scripts/gpu_check.sh, docs/gpu.md)"}


def diagnose() -> dict[str, Any]:
    """freespec's and vLLM's versions, the machine (with how to set up vLLM's CPU worker where that is measured to
    make it faster: ``freespec.machine.cpu_advice``), every probe with its status, and each plugin's state."""
    from freespec import __version__
    from freespec.machine import cpu_advice, describe_machine
    from freespec.proposers.registry import available_plugins, load_proposer_class
    from freespec.vllm_plugins.patches import patch_states
    from freespec.vllm_plugins.probes import (
        blocking_probes,
        cpu_kernel_override_hook,
        run_probes,
        vllm_version,
    )
    from freespec.vllm_plugins.version_gate import is_supported, runner_name, supported_range_text
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
                 "supported_range": supported_range_text(), "supported": supported,
                 "runner": runner_name(version)},
        "machine": machine,
        "advice": cpu_advice(machine),
        "seams": [{"seam": p.seam, "ok": p.ok, "status": _status(p, expand_hook), "detail": p.detail}
                  for p in probes],
        "patches": patch_states({p.seam: p for p in probes}),
        "plugins": plugins,
        "third_party_plugins": third_party_plugins(),
        "metrics": metrics_export(),
        "model_runner": model_runner(installed_vllm_distribution()),
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
        f"runner: {v.get('runner', 'unknown')}",
        f"machine: {machine_summary(data['machine'])}",
    ]
    lines += [f"  note: {a}" for a in data["advice"]]
    lines.append("seams:")
    lines += [f"  [{s['status']}] {s['seam']}: {s['detail']}" for s in data["seams"]]
    lines.append("patches (state in freespec engines; fixes for vLLM's own methods: FREESPEC_FIX_VLLM):")
    for p in data.get("patches", []):
        stock = f"; vLLM's own methods: {p['vllm_methods']}" if p["vllm_methods"] else ""
        upstream = f"; upstream: {p['upstream']}" if p["upstream"] else ""
        lines.append(f"  [{p['state']}] {p['name']}: {p['applied_by']}{stock}{upstream}")
    lines.append("plugins:")
    for p in data["plugins"]:
        if p["usable"]:
            state = "usable"
        elif p["reasons"] and p["reasons"][0].startswith("cannot load"):
            state = "disabled (" + p["reasons"][0] + ")"
        else:
            state = "disabled, vLLM decodes plainly: " + ", ".join(p["reasons"])
        lines.append(f"  {p['name']} ({p['target']}): {state}")
    m = data.get("metrics")
    if m is not None:
        fix = f"; fix: `{m['fix']}` before `vllm serve`" if m.get("fix") else ""
        lines.append(f"metrics: {'' if m['ok'] else 'WARN, '}{m['detail']}{fix}")
    runner = data.get("model_runner")
    if runner is not None:
        lines.append(f"model runner: {runner['detail']}")
    lines.append("third-party plugins (entry-point group freespec.proposers):")
    lines += [_third_party_line(p) for p in data.get("third_party_plugins", [])] or ["  none installed"]
    return "\n".join(lines)
