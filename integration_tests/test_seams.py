"""freespec's named patches and probes against the installed vLLM (each in a fresh process, as vLLM runs them)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

EXPAND_CHECK = """
import torch
from freespec.vllm_plugins import seams
{install}
from vllm.platforms import current_platform
current_platform.register_triton_kernel_overrides()  # what each CPU worker does after loading plugins
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens
out = expand_batch_to_tokens(torch.tensor([0.8, 0.5, 1.0]), torch.tensor([2, 5, 6], dtype=torch.int32), 6)
print("RESULT", out.tolist())
"""


def run_python(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def expanded(install: str) -> list[float]:
    line = next(l for l in run_python(EXPAND_CHECK.format(install=install)).splitlines() if l.startswith("RESULT"))
    return eval(line.removeprefix("RESULT"))


def test_cpu_expand_kernel_patch_makes_per_token_temperatures_right():
    assert expanded("seams.install_cpu_expand_fix()") == pytest.approx([0.8, 0.8, 0.5, 0.5, 0.5, 1.0])


def test_cpu_expand_kernel_defect_is_still_there_upstream():
    """Fails when vLLM fixes its CPU fallback: then the patch (and this test) can go."""
    assert expanded("") != pytest.approx([0.8, 0.8, 0.5, 0.5, 0.5, 1.0])


def test_probes_pass_on_the_supported_release():
    out = run_python(
        "from freespec.vllm_plugins.seams import run_probes\n"
        "for p in run_probes(): print(p.seam, p.ok, p.detail)"
    )
    lines = dict(l.split(" ", 1) for l in out.splitlines())
    for seam in ("frontend", "custom_class", "target_topk"):
        assert lines[seam].startswith("True"), out


def test_target_topk_probe_names_what_moved(monkeypatch):
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from freespec.vllm_plugins import seams

    monkeypatch.delattr(GPUModelRunner, "_calc_spec_decode_metadata")
    result = seams.probe_target_logits()
    assert not result.ok and "_calc_spec_decode_metadata is gone" in result.detail


def test_a_plugin_needing_target_topk_is_dropped_when_that_seam_moved(monkeypatch, caplog):
    from freespec.vllm_plugins import seams

    monkeypatch.setattr(seams, "probe_target_logits", lambda: seams.ProbeResult("target_topk", False, "moved: x"))
    with caplog.at_level("WARNING", logger="freespec"):
        spec, _ = seams._frontend_rewrite({"plugin": "recycle", "num_speculative_tokens": 4}, None)
    assert spec is None and "moved: x" in caplog.text
    spec, _ = seams._frontend_rewrite({"plugin": "copy", "num_speculative_tokens": 4}, None)
    assert spec is not None  # copy does not use that seam


def test_vllm_command_starts_on_cpu():
    vllm = Path(sys.executable).with_name("vllm")
    proc = subprocess.run([str(vllm), "--version"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().startswith("0.32")


def test_doctor_reports_version_probes_and_plugins():
    freespec = Path(sys.executable).with_name("freespec")
    proc = subprocess.run([str(freespec), "doctor"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "vLLM: 0.32" in proc.stdout and "copy" in proc.stdout and "custom_class" in proc.stdout


def test_outside_the_supported_range_speculation_is_dropped_with_one_warning(monkeypatch, caplog):
    from freespec.vllm_plugins import seams

    monkeypatch.setattr(seams, "vllm_version", lambda: "0.99.0")
    with caplog.at_level("WARNING", logger="freespec"):
        spec, extra = seams._frontend_rewrite({"plugin": "copy", "num_speculative_tokens": 4}, {"a": 1})
    assert spec is None and extra == {"a": 1}
    ours = [r for r in caplog.records if r.name == "freespec"]
    assert len(ours) == 1 and "outside freespec's supported range" in ours[0].message


def test_a_bad_config_is_refused_even_outside_the_supported_range(monkeypatch):
    from freespec.vllm_plugins import seams

    monkeypatch.setattr(seams, "vllm_version", lambda: "0.99.0")
    with pytest.raises(ValueError, match="unknown option 'colour'"):
        seams._frontend_rewrite({"plugin": "copy", "num_speculative_tokens": 4, "colour": 1}, None)
