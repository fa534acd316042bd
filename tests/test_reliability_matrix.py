"""Recycle matrix files crafted or mistaken by an operator (issue 19): every one refused with a named error."""
from __future__ import annotations

import io
import json
import os
import stat
import zipfile

import numpy as np
import pytest

from freespec.proposers.recycle.matrix import (
    MAX_VOCAB, Matrix, MatrixFileError, load_matrix, read_matrix, write_matrix,
)

VOCAB, C = 50, 4
FP = "sha256:test-vocab"


def good(tmp_path, name="m.npz") -> str:
    m = Matrix.empty(VOCAB, C, FP, "m")
    m.ids[1, 0] = 2
    path = str(tmp_path / name)
    write_matrix(path, m)
    return path


def npy_bytes(shape, dtype, data: bytes = b"") -> bytes:
    """A .npy member whose header says ``shape``/``dtype``, followed by ``data`` (possibly not matching)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": shape})
    return buf.getvalue() + data


def crafted(tmp_path, members: dict, compression=zipfile.ZIP_STORED) -> str:
    path = str(tmp_path / "crafted.npz")
    with zipfile.ZipFile(path, "w", compression) as z:
        for name, data in members.items():
            z.writestr(f"{name}.npy", data)
    return path


def meta(vocab=VOCAB, c=C) -> bytes:
    raw = json.dumps({"format": "freespec-recycle-matrix", "version": 2, "vocab_size": vocab, "candidates": c,
                      "tokenizer": FP, "sha256": "x"}).encode()
    return npy_bytes((len(raw),), np.uint8, raw)


def test_a_npy_renamed_npz_is_named(tmp_path):
    path = tmp_path / "m.npz"
    np.save(open(path, "wb"), np.zeros((VOCAB, C), np.int32))  # was TypeError from np.load's ndarray
    with pytest.raises(MatrixFileError, match=r"recycle matrix_path .*single \.npy array \(a file renamed \.npz\?\)"):
        load_matrix(str(path), vocab_size=VOCAB, candidates=C, tokenizer=FP)


@pytest.mark.parametrize("payload", [b"", b"hello", b"PK\x03\x04garbage"])
def test_empty_text_and_broken_zip_files_are_refused(tmp_path, payload):
    path = tmp_path / "m.npz"
    path.write_bytes(payload)
    with pytest.raises(MatrixFileError, match="matrix_path"):
        load_matrix(str(path), vocab_size=VOCAB, candidates=C, tokenizer=FP)


def test_a_crafted_header_shape_is_refused_before_allocating(tmp_path):
    # The header promises 2**40 x 8 int32 (32 TiB); np.load raised MemoryError on it.
    huge = npy_bytes((2**40, C), np.int32)
    path = crafted(tmp_path, {"ids": huge, "probs": npy_bytes((2**40, C), np.float16), "meta": meta()})
    with pytest.raises(MatrixFileError, match=r"array 'ids' has shape \(1099511627776, 4\), expected \(50, 4\)"):
        load_matrix(path, vocab_size=VOCAB, candidates=C, tokenizer=FP)
    with pytest.raises(MatrixFileError, match="array 'ids' has shape"):
        read_matrix(path)  # without a configured size too
    big_meta = crafted(tmp_path, {"ids": huge, "probs": huge, "meta": meta(vocab=2**40)})
    with pytest.raises(MatrixFileError, match=f"must be integers in \\[1, {MAX_VOCAB}\\]"):
        read_matrix(big_meta)
    with pytest.raises(MatrixFileError, match="field 'vocab_size' is 1099511627776 .*this server has 50"):
        load_matrix(big_meta, vocab_size=VOCAB, candidates=C, tokenizer=FP)


def test_object_and_fortran_arrays_are_refused_from_the_header(tmp_path):
    path = crafted(tmp_path, {"ids": npy_bytes((VOCAB, C), object), "probs": npy_bytes((VOCAB, C), np.float16),
                              "meta": meta()})
    with pytest.raises(MatrixFileError, match="wrong array types: 'ids' is object"):
        load_matrix(path, vocab_size=VOCAB, candidates=C, tokenizer=FP)


def test_a_compressed_member_declaring_more_than_its_shape_is_refused_before_inflating(tmp_path):
    bomb = npy_bytes((VOCAB, C), np.int32, b"\0" * (8 << 20))  # 8 MiB of zeros behind a 800-byte array
    path = crafted(tmp_path, {"ids": bomb, "probs": npy_bytes((VOCAB, C), np.float16, b"\0" * 400), "meta": meta()},
                   zipfile.ZIP_DEFLATED)
    assert os.path.getsize(path) < 100_000  # what an operator sees on disk
    with pytest.raises(MatrixFileError, match=r"array 'ids' declares \d+ bytes for 800 bytes of data"):
        load_matrix(path, vocab_size=VOCAB, candidates=C, tokenizer=FP)


def test_a_file_larger_than_the_configured_matrix_can_be_is_refused_unread(tmp_path):
    path = tmp_path / "m.npz"
    with open(path, "wb") as f:
        f.write(b"PK\x03\x04")
        f.truncate(4 << 20)  # 4 MiB, sparse
    with pytest.raises(MatrixFileError, match=r"4194304 bytes, more than a matrix of at most 50 tokens x 4"):
        load_matrix(str(path), vocab_size=VOCAB, candidates=C, tokenizer=FP)


def test_a_truncated_member_is_refused(tmp_path):
    path = crafted(tmp_path, {"ids": npy_bytes((VOCAB, C), np.int32, b"\0" * 100),
                              "probs": npy_bytes((VOCAB, C), np.float16, b"\0" * 400), "meta": meta()})
    with pytest.raises(MatrixFileError, match="array 'ids' is truncated"):
        load_matrix(path, vocab_size=VOCAB, candidates=C, tokenizer=FP)


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_files_are_written_with_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        path = good(tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == mode  # was 0600 whatever the umask
    m = load_matrix(path, vocab_size=VOCAB, candidates=C, tokenizer=FP)
    assert m.ids[1, 0] == 2
