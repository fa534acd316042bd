"""Issue 52: files that are not regular files, deep JSON, absurd peer files, header bombs, CLI tracebacks and
the smaller ones (docs/reliability.md, "Files, JSON and peers"). Each class through every reader it has."""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import struct
import threading
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from freespec.cli.main import main
from freespec.option_checks import check_path_option
from freespec.proposers.learned import response_store as rs
from freespec.proposers.recycle.matrix import Matrix, MatrixFileError, read_matrix, save_matrix, write_matrix
from freespec.proposers.learned.response_store import ResponseStore, ResponseStoreError, Stored, read_store, write_store
from freespec.proposers.retrieval.build import build_datastore
from freespec.proposers.retrieval.datastore import Datastore, DatastoreError, file_sha256, read_manifest
from freespec.proposers.retrieval.readers import InputError, iter_documents
from freespec.safe_files import (
    JSONBoundError, NotRegularFileError, check_npy_header, load_json, loads_json, open_regular, read_bounded,
)

FP = "sha256:test-vocab"
VOCAB, C = 50, 4
DEEP = 100_000


def within(seconds: float, fn, *args, **kwargs):
    """``fn(*args)`` in a thread: its result or exception, or a failure if it is still blocked after ``seconds``."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"{getattr(fn, '__name__', fn)} still blocked after {seconds} s")
        # (a FIFO with no writer: the thread stays blocked in open(); it is a daemon)
    if "error" in out:
        raise out["error"]
    return out.get("value")


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def matrix(tmp_path, name="m.npz") -> str:
    m = Matrix.empty(VOCAB, C, FP, "m")
    m.ids[1, 0] = 2
    path = str(tmp_path / name)
    write_matrix(path, m)
    return path


def char_tokenize(texts):
    return [[ord(c) % 1000 for c in t] for t in texts]


def datastore(tmp_path, name="ds") -> Path:
    corpus = tmp_path / f"{name}.jsonl"
    corpus.write_text(json.dumps({"text": "the quick brown fox jumps over the lazy dog"}) + "\n")
    out = tmp_path / name
    build_datastore([str(corpus)], out, char_tokenize, tokenizer_name="chars", fingerprint=FP, vocab_size=1000,
                    progress=False)
    return out


# ---------------------------------------------------------------- class 1: not regular files
def test_open_regular_refuses_a_fifo_a_device_and_a_directory_without_blocking(tmp_path):
    for path in (fifo(tmp_path / "p"), Path("/dev/zero"), tmp_path):
        with pytest.raises(NotRegularFileError):
            within(5, open_regular, path)
    link = tmp_path / "z.py"
    link.symlink_to("/dev/zero")
    with pytest.raises(NotRegularFileError, match="character device"):
        within(5, read_bounded, link, 1 << 20)
    (tmp_path / "ok").write_bytes(b"x")
    assert read_bounded(tmp_path / "ok", 10) == b"x"


def test_a_fifo_as_matrix_path_or_merge_from_is_refused_not_waited_on(tmp_path):
    path = fifo(tmp_path / "m.npz")
    with pytest.raises(MatrixFileError, match="FIFO"):
        within(5, read_matrix, str(path))


def test_a_peer_store_replaced_by_a_fifo_never_blocks_the_file_thread(tmp_path, caplog):
    own = ResponseStore(str(tmp_path / "own.bin"), fingerprint=FP, vocab_size=VOCAB)
    own.add([1, 2, 3])
    peer = fifo(tmp_path / "peer.bin")
    with pytest.raises(ResponseStoreError, match="FIFO"):
        within(5, read_store, str(peer), fingerprint=FP, vocab_size=VOCAB, max_responses=10, max_tokens=100)
    with caplog.at_level(logging.WARNING, logger="freespec"):
        own.merge_async([str(peer)])
        assert own.wait_files(5)  # the background thread went on
        own.save_async()
        assert own.wait_files(5)
    assert own.saves == 1 and "FIFO" in caplog.text
    own.close()


def test_datastore_files_and_build_inputs_that_are_not_regular_files_are_refused(tmp_path):
    store = datastore(tmp_path)
    shard = next(store.glob("*.tokens"))
    shard.unlink()
    fifo(shard)
    with pytest.raises(DatastoreError, match="FIFO"):
        within(5, Datastore.open, store)
    with pytest.raises(NotRegularFileError):
        within(5, file_sha256, shard)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("x = 1\n")
    (src / "z.py").symlink_to("/dev/zero")
    with pytest.raises(InputError, match="z.py: a character device"):
        within(10, lambda: list(iter_documents(src)))
    (src / "z.py").unlink()
    fifo(src / "z.py")
    with pytest.raises(InputError, match="z.py: a FIFO"):
        within(10, lambda: list(iter_documents(src)))


# ---------------------------------------------------------------- class 2: deep JSON
def test_deep_json_is_a_named_refusal_not_a_recursion_error(tmp_path):
    deep = "[" * DEEP + "]" * DEEP
    with pytest.raises(JSONBoundError, match="nested"):
        loads_json(deep, what="x")
    with pytest.raises(JSONBoundError, match="nested 5 levels"):
        loads_json("[[[[[1]]]]]", max_depth=4)
    (tmp_path / "a.json").write_text('{"a": [1, 2]}')
    assert load_json(tmp_path / "a.json", max_bytes=100) == {"a": [1, 2]}
    with pytest.raises(ValueError, match="more than the 5"):
        load_json(tmp_path / "a.json", max_bytes=5)


def test_deep_json_build_inputs_are_refused_naming_the_file(tmp_path):
    (tmp_path / "deep.json").write_text("[" * DEEP + "]" * DEEP)
    with pytest.raises(InputError, match="deep.json.*nested"):
        list(iter_documents(tmp_path / "deep.json"))
    (tmp_path / "deep.jsonl").write_text('{"text": "a"}\n' + "[" * DEEP + "]" * DEEP + "\n")
    with pytest.raises(InputError, match="deep.jsonl: line 2.*nested"):
        list(iter_documents(tmp_path / "deep.jsonl"))
    (tmp_path / "cut.json").write_text('[{"text": "a"}, ' + "[" * DEEP)  # cut off, deep: the salvage path
    with pytest.raises(InputError, match="cut.json"):
        list(iter_documents(tmp_path / "cut.json"))


def _npz_with_meta(path: Path, meta_text: bytes) -> str:
    ids = np.full((VOCAB, C), -1, dtype=np.int32)
    with open(path, "wb") as f:
        np.savez(f, ids=ids, probs=np.zeros((VOCAB, C), np.float16), stamps=np.zeros(VOCAB, np.uint32),
                 meta=np.frombuffer(meta_text, dtype=np.uint8))
    return str(path)


def test_deep_json_in_a_matrix_header_or_a_manifest_is_refused(tmp_path, capsys):
    path = _npz_with_meta(tmp_path / "m.npz", b"[" * DEEP + b"]" * DEEP)
    with pytest.raises(MatrixFileError, match="nested"):
        read_matrix(path)
    assert main(["recycle", "info", path]) == 2
    err = capsys.readouterr().err
    assert "nested" in err and "Traceback" not in err and len(err.splitlines()) == 1
    store = datastore(tmp_path)
    (store / "manifest.json").write_text("[" * DEEP + "]" * DEEP)
    with pytest.raises(DatastoreError, match="manifest.json.*nested"):
        read_manifest(store)


# ---------------------------------------------------------------- class 3: absurd peer numbers
def _entry(stamp, tokens):
    arr = np.asarray(tokens, dtype=np.int32)
    return rs._Entry(stamp, rs._digest(arr), arr)


@pytest.mark.parametrize("stamps, horizon, field", [
    ((2**63 - 1,), 0, "stamps"),
    ((2**62 + 1,), 2**62, "horizon"),
    ((), 2**62, "horizon"),
    ((), 5, "horizon"),  # a horizon in a file without responses: no store writes that
])
def test_a_peer_store_with_absurd_stamps_cannot_erase_or_freeze_this_replica(tmp_path, stamps, horizon, field):
    own = ResponseStore(str(tmp_path / "own.bin"), fingerprint=FP, vocab_size=VOCAB)
    for i in range(100):
        own.add([i // VOCAB, i % VOCAB])
    peer = str(tmp_path / "peer.bin")
    if stamps:
        write_store(peer, Stored([_entry(s, [7, 8]) for s in stamps], (horizon, bytes(16))), fingerprint=FP,
                    vocab_size=VOCAB)
    else:  # no store writes a horizon without responses (write_store drops it): a hostile peer's own bytes
        body = rs._HEADER.pack(rs.MAGIC, rs.VERSION, len(FP.encode()), VOCAB, 0, 0, 0, horizon, bytes(16))
        body += FP.encode()
        Path(peer).write_bytes(body + hashlib.sha256(body).digest())
    with pytest.raises(ResponseStoreError, match=field):
        own.merge_from(peer)
    assert len(own) == 100
    own.add([9, 9])
    own.save()  # no OverflowError: the replica's own file is still written
    assert len(read_store(own.path, fingerprint=FP, vocab_size=VOCAB, max_responses=1000, max_tokens=10_000).entries) == 101


def test_a_matrix_with_nan_probabilities_or_stamps_from_the_far_future_is_refused(tmp_path):
    ids = np.full((VOCAB, C), -1, dtype=np.int32)
    ids[1] = [2, 3, 4, 5]
    probs = np.zeros((VOCAB, C), np.float16)
    for bad in (np.nan, np.inf, -0.5, 2.0):
        probs[1, 0] = bad
        save_matrix(str(tmp_path / "p.npz"), ids, probs, tokenizer=FP)
        with pytest.raises(MatrixFileError, match="'probs'"):
            read_matrix(str(tmp_path / "p.npz"))
    probs[1, 0] = 0.5
    stamps = np.zeros(VOCAB, np.uint32)
    stamps[1] = 2**32 - 1
    save_matrix(str(tmp_path / "s.npz"), ids, probs, stamps, tokenizer=FP)
    with pytest.raises(MatrixFileError, match="'stamps'.*every merge"):
        read_matrix(str(tmp_path / "s.npz"))
    stamps[1] = int(time.time())
    save_matrix(str(tmp_path / "s.npz"), ids, probs, stamps, tokenizer=FP)
    assert read_matrix(str(tmp_path / "s.npz")).stamps[1] == stamps[1]


# ---------------------------------------------------------------- class 4: header bomb
def header_bomb(tmp_path, header_bytes=256 << 20) -> str:
    """A deflated matrix archive whose ``ids.npy`` has a version-2 header of ``header_bytes``."""
    good = matrix(tmp_path, "good.npz")
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "ids.npy":
                data = b"\x93NUMPY\x02\x00" + struct.pack("<I", header_bytes) + b" " * header_bytes
            dst.writestr(info.filename, data)
    return str(path)


def test_a_npy_header_bomb_is_refused_before_it_is_read(tmp_path):
    path = header_bomb(tmp_path)
    assert os.path.getsize(path) < 2 << 20
    tracemalloc.start()
    try:
        with pytest.raises(MatrixFileError, match="'ids'.*header of 268,435,456 bytes"):
            read_matrix(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak
    good = io.BytesIO()
    np.save(good, np.arange(3))
    good.seek(0)
    assert len(check_npy_header(good).getvalue()) < 200


# ---------------------------------------------------------------- class 5: command-line errors
def test_recycle_merge_onto_a_read_only_or_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    a = matrix(tmp_path, "a.npz")
    import freespec.proposers.recycle.matrix as mx

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mx.np, "savez", full)
    assert main(["recycle", "merge", a, "-o", str(tmp_path / "out.npz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out" in err and "No space left" in err and "Traceback" not in err


@pytest.mark.parametrize("change, field", [
    (lambda m: m.update(total_tokens="many"), "total_tokens"),
    (lambda m: m.pop("total_tokens"), "total_tokens"),
    (lambda m: m.update(documents=[1]), "documents"),
    (lambda m: m.update(vocab_size=None), "vocab_size"),
    (lambda m: m["shards"][0].update(tokens_sha256=5), "shards[0].tokens_sha256"),
])
def test_datastore_info_and_verify_name_a_bad_manifest_field_in_one_line(tmp_path, capsys, change, field):
    store = datastore(tmp_path)
    manifest = json.loads((store / "manifest.json").read_text())
    change(manifest)
    (store / "manifest.json").write_text(json.dumps(manifest))
    for command in ("info", "verify"):
        assert main(["datastore", command, str(store)]) != 0
        err = capsys.readouterr().err
        assert field in err and "Traceback" not in err and err.count("\n") == 1, err


def test_the_cli_turns_an_unforeseen_error_into_one_line(tmp_path, capsys, monkeypatch):
    import freespec.cli.recycle as cli_recycle

    def boom(args):
        raise PermissionError(13, "Permission denied", str(tmp_path / "x.npz"))

    monkeypatch.setattr(cli_recycle, "run_info", boom)
    assert main(["recycle", "info", "x.npz"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "x.npz" in err and "Permission denied" in err


# ---------------------------------------------------------------- class 8: smaller ones
@pytest.mark.parametrize("path, why", [("", "empty"), ("a\0b", "NUL byte"), ("/no/such/dir/m.npz", "does not exist")])
def test_path_options_are_checked_at_the_config_stage_naming_the_field(path, why):
    from freespec.proposers.recycle.proposer import RecycleOptions

    for options in ({"matrix_path": path}, {"merge_from": [path]}):
        with pytest.raises(ValueError, match=f"{next(iter(options))}(.|\n)*{why}"):
            RecycleOptions.model_validate(options)
    with pytest.raises(ValueError, match=why):
        check_path_option(path)


def test_one_coercion_rule_strings_are_never_numbers():
    from freespec.proposers.copy import CopyOptions
    from freespec.proposers.recycle.proposer import RecycleOptions

    for cls, options in ((CopyOptions, {"min_match": "2"}), (RecycleOptions, {"candidates": "4"}),
                         (RecycleOptions, {"adaptive": "true"}), (RecycleOptions, {"save_every_s": "1e3"})):
        with pytest.raises(ValueError, match=f"{next(iter(options))}.*never converted"):
            cls.model_validate(options)
    assert RecycleOptions.model_validate({"save_every_s": 10, "tree_widths": [4, 2]}).save_every_s == 10.0


def test_a_killed_recycle_save_leaves_no_temporary_file_behind(tmp_path):
    dead = tmp_path / ".recycle-999999999-m.npz-abcdefgh.npz.tmp"  # a pid no process has
    alive = tmp_path / f".recycle-{os.getppid()}-m.npz-abcdefgh.npz.tmp"
    # another writer's (another target), whose pid may be another PID namespace's: never removed
    other = tmp_path / ".recycle-999999999-peer.npz-abcdefgh.npz.tmp"
    for f in (dead, alive, other):
        f.write_bytes(b"half")
    matrix(tmp_path)
    assert not dead.exists() and alive.exists() and other.exists()


@pytest.mark.parametrize("swap", ["fails", "unsupported"])
def test_a_forced_build_whose_final_rename_fails_keeps_the_old_datastore(tmp_path, monkeypatch, swap):
    from freespec.proposers.retrieval import build

    store = datastore(tmp_path)
    before = (store / "manifest.json").read_text()
    real = Path.rename

    def exchange(a, b):
        if swap == "fails":
            raise OSError(5, "Input/output error")
        return False  # no RENAME_EXCHANGE: two renames, the second one failing

    def rename(self, target):
        if Path(target) == store and self.name.startswith(".ds"):  # the new build taking the old one's place
            raise OSError(5, "Input/output error")
        return real(self, target)

    monkeypatch.setattr(build, "_exchange", exchange)
    monkeypatch.setattr(Path, "rename", rename)
    corpus = tmp_path / "more.jsonl"
    corpus.write_text(json.dumps({"text": "another text"}) + "\n")
    with pytest.raises(OSError):
        build_datastore([str(corpus)], store, char_tokenize, tokenizer_name="chars", fingerprint=FP,
                        vocab_size=1000, progress=False, force=True)
    assert (store / "manifest.json").read_text() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".ds.")] == []


def test_messages_about_huge_values_are_cut_short(tmp_path):
    from freespec.vllm_plugins.frontend import translate

    many = [str(tmp_path / "missing" / f"{i}.npz") for i in range(200_000)]  # 60 MB of messages before
    with pytest.raises(ValueError) as e:
        translate({"plugin": "recycle", "num_speculative_tokens": 4, "merge_from": many}, None)
    assert len(str(e.value)) < 20_000
    store = datastore(tmp_path)
    manifest = json.loads((store / "manifest.json").read_text())
    manifest["shards"] = [["x"] * 1_000_000]
    (store / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DatastoreError) as e:
        read_manifest(store)
    assert "shards[0]" in str(e.value) and len(str(e.value)) < 2_000
