"""``freespec datastore build / info / verify`` as a user runs them, with the real SmolLM2 tokenizer."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from integration_tests.conftest import QUESTIONS

pytestmark = pytest.mark.integration

FREESPEC = Path(sys.executable).with_name("freespec")


def freespec(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(FREESPEC), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tokenizer_dir() -> str:
    from freespec.model_store import prepare_model

    return str(prepare_model())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    if not QUESTIONS.exists():
        pytest.fail(f"Spec-Bench questions not found at {QUESTIONS}")
    path = tmp_path_factory.mktemp("corpus") / "questions.jsonl"
    path.write_text("".join(QUESTIONS.read_text().splitlines(keepends=True)[:40]))
    return path


@pytest.fixture(scope="module")
def built(tokenizer_dir, corpus, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("store") / "ds"
    proc = freespec("datastore", "build", "--tokenizer", tokenizer_dir, "--input", str(corpus),
                    "--out", str(out), "--shard-tokens", "2000")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def test_build(built, corpus, tokenizer_dir):
    from transformers import AutoTokenizer

    from freespec.proposers.retrieval.datastore import SEPARATOR, Datastore
    from freespec.proposers.vocab import vocab_fingerprint

    out, proc = built
    assert proc.stdout.strip().splitlines()[-1] == str(out)
    assert "suffix array in" in proc.stderr and "tokens/s" in proc.stderr

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    store = Datastore.open(out, vocab_fingerprint(tok.get_vocab()))
    turns = [t for line in corpus.read_text().splitlines() for t in json.loads(line)["turns"]]
    assert store.manifest["documents"] == len(turns)
    assert store.manifest["vocab_size"] == len(tok)
    assert len(store.shards) > 1
    stream = [int(t) for shard in store.shards for t in shard.tokens]
    expected = []
    for text in turns:
        expected += tok(text, add_special_tokens=False)["input_ids"] + [int(SEPARATOR)]
    assert stream == expected


def test_info(built, corpus):
    out, _ = built
    proc = freespec("datastore", "info", str(out))
    assert proc.returncode == 0, proc.stderr
    turns = sum(len(json.loads(line)["turns"]) for line in corpus.read_text().splitlines())
    assert "smollm2-135m-instruct (sha256:" in proc.stdout
    assert f"documents   {turns}" in proc.stdout and "on disk" in proc.stdout


def test_verify(built, tmp_path):
    out, _ = built
    proc = freespec("datastore", "verify", str(out))
    assert proc.returncode == 0, proc.stderr
    assert ": ok (" in proc.stdout

    # A corrupted copy fails, with the problem listed.
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    sa = bad / "shard-00000.sa"
    data = bytearray(sa.read_bytes())
    data[-1] ^= 0xFF
    sa.write_bytes(bytes(data))
    proc = freespec("datastore", "verify", str(bad))
    assert proc.returncode == 1
    assert "shard-00000.sa: checksum mismatch" in proc.stderr


def test_errors_exit_2_without_traceback(tokenizer_dir, corpus, tmp_path):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "tokenizer_config.json").write_text("{not json")
    cases = [
        (["--tokenizer", tokenizer_dir, "--input", str(tmp_path / "missing.jsonl")],
         "missing.jsonl: no such file"),
        (["--tokenizer", str(tmp_path / "no-model"), "--input", str(corpus)], "does not exist"),
        (["--tokenizer", str(tmp_path), "--input", str(corpus)], "holds no tokenizer"),
        (["--tokenizer", str(broken), "--input", str(corpus)], "cannot load a tokenizer from"),
    ]
    for args, message in cases:
        proc = freespec("datastore", "build", *args, "--out", str(tmp_path / "ds"))
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "ds").exists()

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "manifest.json").write_text("{}")
    proc = freespec("datastore", "build", "--tokenizer", tokenizer_dir, "--input", str(corpus),
                    "--out", str(tmp_path / "full"))
    assert proc.returncode == 2 and "is not empty; pass --force" in proc.stderr
