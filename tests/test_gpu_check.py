"""scripts/gpu_check.sh on a machine without a GPU: its arguments, --dry-run, and what it packs.

The GPU steps themselves need a CUDA machine; here a stand-in ``nvidia-smi`` on PATH plays the card,
and the steps that would install or run vLLM are skipped or given a Python that fails.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
HEAVY = ("--skip", "install", "--skip", "doctor", "--skip", "model", "--skip", "lossless", "--skip", "bench",
         "--skip", "runners")


def gpu_check(*args: str, smi_exit: int | None = 0, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the script in ``cwd`` (default: a fresh folder) with a stand-in nvidia-smi (exit status
    ``smi_exit``; None: no nvidia-smi at all). HOME is a fresh folder too, so its default environment
    (~/.cache/freespec/gpu-venv) can never be a real one."""
    with tempfile.TemporaryDirectory() as tmp:
        bin_dir = Path(tmp) / "bin"
        bin_dir.mkdir()
        if smi_exit is not None:
            smi = bin_dir / "nvidia-smi"
            smi.write_text(f"#!/bin/sh\necho 'name, memory.total [MiB]'\necho 'Stand-in GPU, 81559 MiB'\n"
                           f"exit {smi_exit}\n")
            smi.chmod(0o755)
        env = {**os.environ, "PATH": os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"]), "HOME": tmp}
        env.pop("XDG_CACHE_HOME", None)
        return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, check=False, cwd=cwd or tmp,
                              env=env, timeout=120)


def test_help_lists_every_option():
    out = gpu_check("--help").stdout
    for option in ("--model", "--out", "--install", "--venv", "--python", "--plugins", "--configs",
                   "--concurrency", "--bench-args", "--skip", "--dry-run"):
        assert option in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--frobnicate"], "unknown option --frobnicate"),
        (["--model"], "--model needs a value"),
        (["--install", "conda"], "--install must be clone, pypi or none"),
        (["--skip", "lunch"], "no step named 'lunch'"),
        (["--plugins", "copy eagle"], "'eagle' is not one of"),
        (["--concurrency", "1 x"], "'x' is not a positive integer"),
        (["--concurrency", "0"], "'0' is not a positive integer"),
    ],
)
def test_bad_arguments_exit_2_naming_the_problem(args, message):
    result = gpu_check(*args, "--dry-run")
    assert result.returncode == 2
    assert message in result.stderr


def test_dry_run_prints_every_step_and_runs_nothing(tmp_path):
    out = tmp_path / "check"
    result = gpu_check("--dry-run", "--out", str(out), "--model", "org/model", "--plugins", "copy pearl",
                       "--concurrency", "1 4", smi_exit=None)  # no nvidia-smi needed to print the plan
    assert result.returncode == 0, result.stderr
    text = result.stdout
    for step in ("gpu", "install", "doctor", "model", "lossless", "bench", "runners", "kernels"):
        assert f"== {step} (-> {out}/" in text
    assert "pip install /" in text and "\\[cuda\\,bench\\]" in text  # the clone, non-editable (printed with %q)
    assert "gpu_lossless.py --model org/model --plugins copy pearl" in text
    assert "bench --model org/model --configs none ngram suffix copy hybrid --concurrency 1 4" in text
    assert "kernel_timing.py --out" in text
    assert f"{out}.tar.gz" in text
    assert not out.exists()
    assert "/.cache/freespec/gpu-venv/bin/python -m pip install" in text


def test_dry_run_install_modes(tmp_path):
    pypi = gpu_check("--dry-run", "--install", "pypi", "--venv", str(tmp_path / "v")).stdout
    assert "vllm-freespec\\[cuda\\,bench\\]" in pypi and f"-m venv {tmp_path / 'v'}" in pypi
    none = gpu_check("--dry-run", "--install", "none", "--python", "python3").stdout
    assert "-m venv" not in none and "-m freespec.cli.main doctor" in none


def test_without_a_gpu_it_stops_at_the_first_step(tmp_path):
    result = gpu_check("--out", str(tmp_path / "check"), smi_exit=9)
    assert result.returncode == 1
    assert "no usable NVIDIA GPU" in result.stderr
    assert not (tmp_path / "check.tar.gz").exists()


def test_it_packs_the_folder_and_says_what_to_send_back(tmp_path):
    result = gpu_check("--out", "check", "--skip", "kernels", *HEAVY, cwd=tmp_path)  # --out: relative to here
    assert result.returncode == 0, result.stdout + result.stderr
    archive = tmp_path / "check.tar.gz"
    assert f"Send back this one file: {archive}" in result.stdout
    summary = (tmp_path / "check" / "summary.md").read_text()
    assert "| gpu | ok" in summary and "| bench | skipped |" in summary and "Stand-in GPU" in summary
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert {"check/summary.md", "check/gpu.txt", "check/run.txt"} <= set(names)


def test_a_failed_step_is_recorded_and_fails_the_run_after_the_others(tmp_path):
    false = shutil.which("false")
    result = gpu_check("--out", str(tmp_path / "check"), "--install", "none", "--python", false, *HEAVY)
    assert result.returncode == 1
    summary = (tmp_path / "check" / "summary.md").read_text()
    assert "| kernels | FAILED (exit 1" in summary and "| install | none" in summary
    assert (tmp_path / "check.tar.gz").exists()


def test_no_speculation_is_measured_on_both_model_runners(tmp_path):
    """Model Runner V2 (vLLM's CUDA default) does not take custom_class: plugins run on V1, so the check measures
    plain decoding on each runner (VLLM_USE_V2_MODEL_RUNNER, read in vllm/envs.py and config/vllm.py)."""
    out = tmp_path / "check"
    text = gpu_check("--dry-run", "--out", str(out), "--model", "org/model", "--concurrency", "1 4").stdout
    runners = text[text.index("== runners"):text.index("== kernels")]
    for flag, folder in (("1", "runner_v2"), ("0", "runner_v1")):
        assert (f"env VLLM_USE_V2_MODEL_RUNNER={flag} " in runners and "bench --model org/model --configs none "
                f"--concurrency 1 4 --per-category 2 --max-tokens 128 --out {out}/{folder}" in runners)
    assert "--configs none" in runners and "copy" not in runners
    assert "runners" in gpu_check("--help").stdout


def test_the_summary_shows_each_runners_baseline(tmp_path):
    """With a stand-in `freespec` that writes what the bench would, summary.md has one section per runner."""
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    fake = venv / "freespec"
    fake.write_text('#!/bin/bash\nout=""; while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done\n'
                    'mkdir -p "$out" && echo "| none | runner $VLLM_USE_V2_MODEL_RUNNER |" > "$out/results.md"\n')
    fake.chmod(0o755)
    (venv / "python").symlink_to(shutil.which("false"))  # kernels fail: recorded, the rest still packed
    result = gpu_check("--out", str(tmp_path / "check"), "--venv", str(tmp_path / "venv"), "--skip", "install",
                       "--skip", "doctor", "--skip", "model", "--skip", "lossless", "--skip", "bench")
    summary = (tmp_path / "check" / "summary.md").read_text()
    assert "| runners | ok" in summary, result.stdout + result.stderr
    v2 = summary.index("## No speculation on Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1)")
    v1 = summary.index("## No speculation on Model Runner V1 (VLLM_USE_V2_MODEL_RUNNER=0)")
    assert v2 < v1 and "| none | runner 1 |" in summary[v2:v1] and "| none | runner 0 |" in summary[v1:]
    assert "freespec's plugins run on this runner" in summary[v1:]
