"""The README's first command (``bash scripts/quickstart.sh``) from a clone with nothing beside it.

A user's clone has no ``../shared``: the main job must find its questions itself (here offline, so the
built-in prompt set) and run to the end. The clone borrows this checkout's ``.venv`` (the install itself
is what ``scripts/setup.sh`` does on every fresh machine, CI's included), so the Python code that runs is
this checkout's; the scripts are the clone's.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]


def _setup_stamp(root: Path) -> str:
    text = (root / "pyproject.toml").read_bytes() + (root / "scripts/setup.sh").read_bytes()
    return hashlib.sha256(text).hexdigest()


def test_quickstart_runs_from_a_clone_with_nothing_beside_it(tmp_path, model_path):
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    alone = tmp_path / "alone"
    clone = alone / "freespec"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    venv = REPO / ".venv"
    stamp = (venv / ".freespec-setup").read_text().strip()
    if _setup_stamp(clone) != stamp:
        # setup.sh would reinstall freespec from the clone into the shared venv.
        pytest.skip("pyproject.toml or scripts/setup.sh differ from the committed ones; commit them first")
    (clone / ".venv").symlink_to(venv)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "models").symlink_to(Path(model_path).parent)  # the prepared model, without preparing it again
    env = {k: v for k, v in os.environ.items() if not k.startswith("FREESPEC_")}
    # Offline, as on this machine: the download is refused at once (a closed local port).
    env.update(FREESPEC_CACHE=str(cache), FREESPEC_QUESTIONS_URL="http://127.0.0.1:9/question.jsonl")
    out = tmp_path / "results"
    proc = subprocess.run(
        ["bash", "scripts/quickstart.sh", "--configs", "none,hybrid", "--categories", "writing,coding",
         "--per-category", "1", "--max-tokens", "24", "--warmup", "1", "--dtype", "float32",
         # Eager: the servers start without compiling (the test took 154 s in the fresh-clone run of 04bcf07, 366 s
         # compiled in the CI run of 1448004); what is checked is the job's path.
         "--server-args=--enforce-eager", "--out", str(out)],
        cwd=clone, env=env, capture_output=True, text=True, timeout=1200)
    log = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, log
    assert not (alone.parent / "shared").exists() and sorted(p.name for p in alone.iterdir()) == ["freespec"]
    assert "questions: builtin" in proc.stdout, log  # the bench says which set it used
    result = json.loads((out / "results.json").read_text())
    assert {c["label"]: c["status"] for c in result["configs"]} == {"none": "ok", "hybrid": "ok"}
    assert result["settings"]["question_set"] == "builtin"
    hybrid = [r for r in result["aggregates"] if r["config"] == "hybrid"]
    # Lossless: float32, so greedy text is exactly no speculation's.
    assert hybrid and all(r["text_identical"] == r["text_compared"] > 0 for r in hybrid)
