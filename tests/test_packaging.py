"""A regular (non-editable) install lays the folders out under the `freespec` namespace."""
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_wheel_installs_every_folder_under_freespec(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(REPO)],
        check=True,
    )
    wheel = next(tmp_path.glob("vllm_freespec-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("vllm_plugins/adapter.py", "proposers/copy.py", "scorers/acceptance.py", "kernels/__init__.py",
                   "cli/main.py"):
        assert f"freespec/{module}" in names
    assert not [n for n in names if n.split("/")[0] in ("kernels", "proposers", "tests", "integration_tests")]
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "freespec = freespec.vllm_plugins:register" in entry_points
    assert "copy = freespec.proposers.copy:CopyProposer" in entry_points
    assert "vllm = freespec.vllm_plugins.vllm_cli:main" in entry_points

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True)
    code = "import freespec.proposers.copy as m, sys; print(m.__file__)"
    out = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(target)!r}); {code}"],
                         cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert out.strip().startswith(str(target))
