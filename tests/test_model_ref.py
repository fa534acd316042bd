"""freespec.model_ref.resolve_model: local directories, fixture names, and Hugging Face ids.

The ids resolve through the real huggingface_hub against a small cache laid out as the hub
lays it out (``models--org--name/refs/<ref>`` holding a commit hash, ``snapshots/<hash>/``
holding the files), under tmp_path. No network: offline mode, or a hub endpoint that
refuses connections.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from freespec import model_store
from freespec.model_ref import ModelRefError, hub_cache_dir, resolve_model, split_model_id

MAIN = "a" * 40
TAGGED = "b" * 40


def _snapshot(cache: Path, repo_id: str, commit: str, refs: tuple[str, ...] = (),
              files: tuple[str, ...] = ("config.json", "tokenizer_config.json")) -> Path:
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for name in files:
        (snap / name).write_text(json.dumps({"commit": commit}))
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snap


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    """An offline Hugging Face cache with org/tiny at main and at tag v1."""
    cache = tmp_path / "hf-cache"
    _snapshot(cache, "org/tiny", MAIN, refs=("main",))
    _snapshot(cache, "org/tiny", TAGGED, refs=("v1",))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("FREESPEC_CACHE", str(tmp_path / "freespec-cache"))
    return cache


# --------------------------------------------------------------------------- Hugging Face ids


def test_id_resolves_to_the_snapshot_of_main(hub):
    assert resolve_model("org/tiny", "draft_model") == hub / "models--org--tiny" / "snapshots" / MAIN


def test_revision_after_at_picks_a_tag_or_a_commit(hub):
    snapshots = hub / "models--org--tiny" / "snapshots"
    assert resolve_model("org/tiny@v1", "draft_model") == snapshots / TAGGED
    assert resolve_model(f"org/tiny@{TAGGED}", "draft_model") == snapshots / TAGGED
    assert split_model_id("org/tiny@v1") == ("org/tiny", "v1")
    assert split_model_id("org/tiny") == ("org/tiny", None)


def test_missing_id_offline_fails_fast_naming_field_cache_and_what_was_tried(hub):
    start = time.monotonic()
    with pytest.raises(ModelRefError) as error:
        resolve_model("org/absent", "draft_model")
    assert time.monotonic() - start < 5
    message = str(error.value)
    assert message.startswith("draft_model: 'org/absent'")
    assert str(hub) in message and "HF_HUB_OFFLINE" in message
    assert "not a local directory" in message and "smollm2-135m-instruct" in message


def test_missing_revision_offline_is_refused(hub):
    with pytest.raises(ModelRefError, match=r"--tokenizer: 'org/tiny@v9'.*revision v9"):
        resolve_model("org/tiny@v9", "--tokenizer", kind="tokenizer")


def test_snapshot_without_config_is_not_a_model_but_may_be_a_tokenizer(hub):
    snap = _snapshot(hub, "org/tok-only", MAIN, refs=("main",), files=("tokenizer.json",))
    with pytest.raises(ModelRefError, match=r"draft_model: the snapshot of 'org/tok-only' .* without config"):
        resolve_model("org/tok-only", "draft_model")
    assert resolve_model("org/tok-only", "--tokenizer", kind="tokenizer") == snap


def test_invalid_id_is_refused_naming_the_field(hub):
    with pytest.raises(ModelRefError, match=r"draft_model: 'org/bad name!'.*not a valid id"):
        resolve_model("org/bad name!", "draft_model")


def test_hf_home_names_the_cache_when_hf_hub_cache_is_unset(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_cache_dir() == tmp_path / "home" / "hub"
    snap = _snapshot(tmp_path / "home" / "hub", "org/tiny", MAIN, refs=("main",))
    assert resolve_model("org/tiny", "draft_model") == snap


def test_without_huggingface_hub_the_error_names_the_extra(hub, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails as if not installed
    with pytest.raises(ModelRefError, match=r"draft_model: .*huggingface_hub.*vllm-freespec\[cpu\] or"):
        resolve_model("org/tiny", "draft_model")


_RESOLVE = """
import sys
from freespec.model_ref import ModelRefError, resolve_model
try:
    print(resolve_model(sys.argv[1], "draft_model"))
except ModelRefError as e:
    print("ERROR", e)
"""


def test_unreachable_hub_falls_back_to_the_cache(hub):
    # Offline mode off, and a hub that refuses connections: huggingface_hub reads its endpoint at
    # import, hence a fresh interpreter.
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"
    run = [sys.executable, "-c", _RESOLVE]
    found = subprocess.run([*run, "org/tiny"], env=env, capture_output=True, text=True, timeout=120,
                           check=False)
    assert found.stdout.strip() == str(hub / "models--org--tiny" / "snapshots" / MAIN), found.stderr
    missing = subprocess.run([*run, "org/absent"], env=env, capture_output=True, text=True, timeout=120,
                             check=False)
    assert missing.stdout.startswith("ERROR draft_model: 'org/absent'"), missing.stderr
    assert "the hub could not be reached" in missing.stdout


# --------------------------------------------------------------------------- directories and fixtures


def test_local_directory_resolves_to_itself(tmp_path, hub):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path / "ckpt"), "draft_model") == (tmp_path / "ckpt").resolve()


def test_directory_without_config_is_refused_for_a_model(tmp_path, hub):
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    with pytest.raises(ModelRefError, match=r"draft_model: .* without config.json"):
        resolve_model(str(tmp_path / "tok"), "draft_model")
    tok = resolve_model(str(tmp_path / "tok"), "--tokenizer", kind="tokenizer")
    assert tok == (tmp_path / "tok").resolve()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelRefError, match=r"--tokenizer: .* holds no tokenizer"):
        resolve_model(str(tmp_path / "empty"), "--tokenizer", kind="tokenizer")


def test_missing_path_is_refused_without_asking_the_hub(tmp_path, hub):
    with pytest.raises(ModelRefError, match=r"draft_model: .* does not exist.*neither a checkpoint"):
        resolve_model(str(tmp_path / "nowhere"), "draft_model")


def test_fixture_name_resolves_to_its_prepared_directory(tmp_path, hub):
    spec = model_store.MODELS["smollm2-135m-instruct"]
    with pytest.raises(ModelRefError, match=r"draft_model: .* not prepared .*models prepare smollm2"):
        resolve_model(spec.name, "draft_model")
    path = model_store.model_dir(spec.name)
    path.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer_config.json"):
        (path / name).write_text("{}")
    marker = {"format": model_store.MARKER_FORMAT, "name": spec.name, "source_sha256": spec.sha256}
    (path / model_store.MARKER_NAME).write_text(json.dumps(marker))
    assert resolve_model(spec.name, "draft_model") == path
    assert path == tmp_path / "freespec-cache" / "models" / spec.name


# --------------------------------------------------------------------------- datastore build --tokenizer


def test_datastore_build_takes_a_model_id(tmp_path, hub, capsys):
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    from freespec.cli.main import main

    snap = _snapshot(hub, "org/words", MAIN, refs=("main",), files=())
    words = ["[UNK]", "the", "cat", "sat", "on", "mat", "a", "dog"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(snap / "tokenizer.json"))
    (snap / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]"}))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat\n\na dog sat on a cat\n")

    code = main(["datastore", "build", "--tokenizer", "org/words", "--input", str(corpus),
                 "--out", str(tmp_path / "ds")])
    assert code == 0, capsys.readouterr().err
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert manifest["tokenizer"]["name"] == "org/words"  # the id, not the snapshot's commit hash
    assert manifest["vocab_size"] == len(words)
    assert manifest["total_tokens"] == 6 + 6 + 2  # words of both paragraphs and one separator each

    assert main(["datastore", "build", "--tokenizer", "org/nothing", "--input", str(corpus),
                 "--out", str(tmp_path / "ds2")]) == 2
    err = capsys.readouterr().err
    assert "--tokenizer: 'org/nothing'" in err and "HF_HUB_OFFLINE" in err and "Traceback" not in err
