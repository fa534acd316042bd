"""scripts/gpu_check.sh's vLLM 0.34 path (Model Runner V2) and the pure parts of gpu_lossless.py, without a GPU.

The installed vLLM picks the path (``version_gate.uses_v2_registry``); here ``--vllm`` names it for a dry run and a
stand-in Python reports it for a real run whose heavy steps are skipped.
"""
from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

from test_gpu_check import gpu_check

REPO = Path(__file__).resolve().parents[1]


def test_the_dry_run_for_vllm_034_checks_suffix_each_plugin_and_the_method_name_with_tok_s(tmp_path):
    out = tmp_path / "check"
    text = gpu_check("--dry-run", "--vllm", "0.34.0", "--out", str(out), "--model", "org/model", smi_exit=None).stdout
    assert "vllm==0.34.0" in text and "Model Runner V2" in text
    assert ("gpu_lossless.py --model org/model --plugins suffix hybrid freespec_hybrid copy recycle retrieval pearl "
            "--speed 1 16 --budget-s") in text
    assert "== bench: not on this path" in text and "== runners: not on this path" in text
    assert "device_v2_check.py --device cuda --turns 2" in text
    assert "VLLM_USE_V2_MODEL_RUNNER" not in text


def test_the_dry_run_for_vllm_033_is_the_v1_path_alone():
    text = gpu_check("--dry-run", "--vllm", "0.33.0", smi_exit=None).stdout
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in text and "--speed" not in text
    assert "== speculators: not on this path" in text and "pip installs the newest" not in text


def test_without_a_known_vllm_the_dry_run_prints_both_paths():
    text = gpu_check("--dry-run", smi_exit=None).stdout
    v1, v2 = text.index("the V1 runner"), text.index("Model Runner V2")
    assert v1 < v2 and "--speed 1 16" in text[v2:] and "VLLM_USE_V2_MODEL_RUNNER" in text[:v2]


@pytest.mark.parametrize("args, message", [(["--vllm", "0.34"], "not a release like 0.34.0"),
                                           (["--budget", "ten"], "not a positive number of seconds")])
def test_bad_v2_arguments_exit_2(args, message):
    result = gpu_check(*args, "--dry-run")
    assert result.returncode == 2 and message in result.stderr


def test_a_vllm_034_run_records_its_path_and_what_it_does_not_run(tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 0.34.0\n")  # reports vLLM 0.34.0; every step it runs 'passes'
    python.chmod(0o755)
    result = gpu_check("--out", str(tmp_path / "check"), "--install", "none", "--python", str(python), "--skip",
                       "doctor", "--skip", "model", "--skip", "lossless", "--skip", "kernels")
    summary = (tmp_path / "check" / "summary.md").read_text()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "vllm: 0.34.0; path: Model Runner V2" in summary and "| speculators | ok" in summary
    assert "| runners | not on this path" in summary and "| bench | not on this path" in summary


@pytest.fixture(scope="module")
def lossless():
    argv = sys.argv
    try:
        sys.argv = ["gpu_lossless"]
        return runpy.run_path(str(REPO / "scripts" / "gpu_lossless.py"), run_name="gpu_lossless")
    finally:
        sys.argv = argv


def test_each_config_spelling(lossless):
    spec_for = lossless["spec_for"]
    assert spec_for("suffix", "/m", None, "cuda:0") == {"method": "suffix", "num_speculative_tokens": 6}
    assert spec_for("hybrid", "/m", None, "cuda:0") == {"plugin": "hybrid", "num_speculative_tokens": 6}
    assert spec_for("freespec_retrieval", "/m", "/ds", "cuda:0") == {
        "method": "freespec_retrieval", "num_speculative_tokens": 6, "speculator_options": {"datastore": "/ds"}}


def test_speed_prompts_are_fresh_per_level_and_unlike_the_greedy_ones(lossless):
    jobs = lossless["speed_jobs"]([1, 16], 64)
    assert [(j["wave"], len(j["prompts"])) for j in jobs] == [(1, 4), (16, 16)]
    prompts = [p for j in jobs for p in j["prompts"]]
    assert len(set(prompts)) == len(prompts) and not set(prompts) & set(lossless["PROMPTS"])


def test_the_table_gives_tok_s_with_the_ratio_to_none_and_names_configs_not_run(lossless):
    row = {"prompts": 8, "identical": 8, "tie_divergences": 0, "problems": [], "ok": True, "engine_seconds": 9,
           "draft_tokens": 0, "accepted_tokens": 0, "output_tokens": 100}
    result = {"model": "m", "dtype": "float32", "max_tokens": 64, "tie_epsilon": 0.01, "speed_levels": [1, 16],
              "configs": {"none": {**row, "tok_s": {"1": 100.0, "16": 800.0}},
                          "hybrid": {**row, "tok_s": {"1": 150.0, "16": 800.0}},
                          "pearl": {"error": "time budget 400 s", "ok": False, "not_run": True}}}
    table = lossless["markdown"](result)
    assert "| hybrid | 150.0 (1.50x) | 800.0 (1.00x) |" in table
    assert "| pearl | NOT RUN (time budget 400 s)" in table
