"""Token recycling's adjacency matrix on disk: saved atomically, refused when foreign or corrupt, merged.

Format (version 2): a NumPy ``.npz`` archive read with ``allow_pickle=False``
(no object arrays, nothing is unpickled) holding four arrays:

- ``ids``: int32 ``[vocab_size, candidates]``, the target's top candidates after
  each token, best first; -1 where nothing was recorded yet;
- ``probs``: float16 ``[vocab_size, candidates]``, the probability the target
  gave each candidate when it was recorded;
- ``stamps``: uint32 ``[vocab_size]``, when each row was last written (Unix
  seconds, by the clock of the server that wrote it); 0 for a row never written;
- ``meta``: uint8, UTF-8 JSON with ``format`` ("freespec-recycle-matrix"),
  ``version`` (2), ``vocab_size``, ``candidates``, ``tokenizer`` (the vocabulary
  fingerprint, ``freespec.proposers.vocab``), ``model`` (informational),
  ``updates`` and ``sha256`` (of the ``ids``, ``probs`` then ``stamps`` bytes).

Version 1 (no ``stamps``; checksum over ``ids`` and ``probs``) is still read:
its known rows get stamp 1, older than any row a version-2 writer records.

Merge rule: **the newest row wins** (a row never written never wins; on equal
stamps the matrix merged into keeps its row). For one server the matrix holds
the target's candidates from the last time it scored each token; merged, it holds
them from the last time any replica did, as if the fleet were one server. The
rule is commutative up to ties, associative and idempotent, so a replica may
merge a file that already contains its own rows, and files may be merged in any
order or grouping.

Saving writes a temporary file next to the target, fsyncs it and renames it
over the target, so a crash leaves either the old or the new file, never half
of one.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

FORMAT = "freespec-recycle-matrix"
VERSION = 2
READABLE_VERSIONS = (1, 2)
STAMP_MAX = np.iinfo(np.uint32).max


class MatrixFileError(ValueError):
    """A matrix file that must not be used (the message says which file and why)."""


@dataclass
class Matrix:
    ids: np.ndarray  # int32 [vocab_size, candidates]
    probs: np.ndarray  # float16 [vocab_size, candidates]
    stamps: np.ndarray  # uint32 [vocab_size]
    tokenizer: str
    model: str = ""
    updates: int = 0
    meta: dict = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return int(self.ids.shape[0])

    @property
    def candidates(self) -> int:
        return int(self.ids.shape[1])

    @classmethod
    def empty(cls, vocab_size: int, candidates: int, tokenizer: str, model: str = "") -> "Matrix":
        return cls(
            np.full((vocab_size, candidates), -1, dtype=np.int32),
            np.zeros((vocab_size, candidates), dtype=np.float16),
            np.zeros(vocab_size, dtype=np.uint32),
            tokenizer,
            model,
        )

    def nbytes(self) -> int:
        return self.ids.nbytes + self.probs.nbytes + self.stamps.nbytes


def default_stamps(ids: np.ndarray) -> np.ndarray:
    """Stamps for rows of unknown age (version 1): 1 for a known row, 0 for an empty one."""
    return (np.asarray(ids)[:, 0] >= 0).astype(np.uint32)


def _digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def save_matrix(
    path: str,
    ids: np.ndarray,
    probs: np.ndarray,
    stamps: Optional[np.ndarray] = None,
    *,
    tokenizer: str,
    model: str = "",
    updates: int = 0,
) -> None:
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    probs = np.ascontiguousarray(probs, dtype=np.float16)
    stamps = default_stamps(ids) if stamps is None else np.ascontiguousarray(stamps, dtype=np.uint32)
    if probs.shape != ids.shape or stamps.shape != ids.shape[:1]:
        raise ValueError(f"matrix arrays do not agree: ids {ids.shape}, probs {probs.shape}, stamps {stamps.shape}")
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "vocab_size": int(ids.shape[0]),
        "candidates": int(ids.shape[1]),
        "tokenizer": tokenizer,
        "model": model,
        "updates": int(updates),
        "sha256": _digest(ids, probs, stamps),
    }
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".recycle-", suffix=".npz.tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(
                f, ids=ids, probs=probs, stamps=stamps,
                meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
            )
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_matrix(path: str, m: Matrix) -> None:
    save_matrix(path, m.ids, m.probs, m.stamps, tokenizer=m.tokenizer, model=m.model, updates=m.updates)


def read_matrix(path: str, what: str = "recycle matrix") -> Matrix:
    """Read a matrix file and check that it is whole and well-formed (not whose it is: ``check_compatible``).

    Any doubt raises ``MatrixFileError`` naming ``what`` (the option or argument), the file and the reason.
    """

    def refuse(why: str) -> MatrixFileError:
        return MatrixFileError(f"{what} {path!r}: {why}")

    try:
        with np.load(path, allow_pickle=False) as z:
            names = set(z.files)
            if not {"ids", "probs", "meta"} <= names:
                raise refuse(f"not a {FORMAT} file (arrays {sorted(names)})")
            meta = json.loads(z["meta"].tobytes().decode())
            ids, probs = z["ids"], z["probs"]
            stamps = z["stamps"] if "stamps" in names else None
    except MatrixFileError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, KeyError, UnicodeDecodeError) as e:
        raise refuse(f"unreadable or corrupt ({type(e).__name__}: {e})") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise refuse(f"not a {FORMAT} file")
    version = meta.get("version")
    if version not in READABLE_VERSIONS:
        raise refuse(f"format version {version!r}, this freespec reads versions {list(READABLE_VERSIONS)}")
    if ids.dtype != np.int32 or probs.dtype != np.float16 or ids.ndim != 2 or probs.shape != ids.shape:
        raise refuse(f"wrong array types ({ids.dtype} {ids.shape}, {probs.dtype} {probs.shape})")
    if meta.get("vocab_size") != ids.shape[0] or meta.get("candidates") != ids.shape[1]:
        raise refuse(
            f"field 'vocab_size'/'candidates' ({meta.get('vocab_size')}, {meta.get('candidates')}) "
            f"does not match the ids array {ids.shape}"
        )
    if version == 1:
        digest, stamps = _digest(ids, probs), default_stamps(ids)
    else:
        if stamps is None or stamps.dtype != np.uint32 or stamps.shape != ids.shape[:1]:
            raise refuse(f"array 'stamps' missing or wrong ({None if stamps is None else (stamps.dtype, stamps.shape)})")
        digest = _digest(ids, probs, stamps)
    if digest != meta.get("sha256"):
        raise refuse("checksum mismatch (the file was modified or truncated)")
    if ids.size and (ids.min() < -1 or ids.max() >= ids.shape[0]):
        raise refuse("token ids outside the vocabulary")
    # np.load's arrays are fresh (read from the archive), so they are returned without another copy.
    return Matrix(
        ids, probs, stamps, str(meta.get("tokenizer")),
        str(meta.get("model", "")), int(meta.get("updates", 0)), meta,
    )


def check_compatible(
    m: Matrix, *, vocab_size: int, candidates: int, tokenizer: str, what: str, path: str, against: str = "this server"
) -> None:
    """Refuse a matrix learned for another vocabulary, naming the field that differs."""

    def refuse(why: str) -> MatrixFileError:
        return MatrixFileError(f"{what} {path!r}: {why}")

    if m.tokenizer != tokenizer:
        raise refuse(
            f"learned with another tokenizer: field 'tokenizer' is {m.tokenizer!r} (model {m.model!r}), "
            f"{against}'s tokenizer is {tokenizer!r}"
        )
    if m.vocab_size != vocab_size:
        raise refuse(f"field 'vocab_size' is {m.vocab_size} (vocabulary size), {against} has {vocab_size}")
    if m.candidates != candidates:
        raise refuse(f"field 'candidates' is {m.candidates} per token, {against}'s option `candidates` is {candidates}")


def load_matrix(path: str, *, vocab_size: int, candidates: int, tokenizer: str, what: str = "recycle matrix_path") -> Matrix:
    """Read a matrix file and check it belongs to this vocabulary; any doubt raises ``MatrixFileError``."""
    m = read_matrix(path, what)
    check_compatible(m, vocab_size=vocab_size, candidates=candidates, tokenizer=tokenizer, what=what, path=path)
    return m


def merge_into(dst: Matrix, src: Matrix) -> int:
    """Merge ``src`` into ``dst`` in place (the newest row wins); returns how many rows were taken from ``src``.

    The caller has checked that both belong to the same vocabulary (``check_compatible``).
    Scratch memory: two boolean vectors of ``vocab_size``.
    """
    take = (src.stamps > dst.stamps) & (src.ids[:, 0] >= 0)
    dst.ids[take] = src.ids[take]
    dst.probs[take] = src.probs[take]
    dst.stamps[take] = src.stamps[take]
    return int(take.sum())


def merge_files(paths: list[str], out: str) -> tuple[Matrix, list[int]]:
    """Merge matrix files into ``out`` (atomically). Returns the result and the rows taken from each file.

    Memory: two matrices at a time (the result and the file being read), whatever the number of files.
    Every file must have the first one's tokenizer, vocabulary size and candidate count.
    """
    if not paths:
        raise ValueError("no matrix files to merge")
    first = read_matrix(paths[0], "merge input")
    result = Matrix.empty(first.vocab_size, first.candidates, first.tokenizer, first.model)
    taken = [merge_into(result, first)]
    result.updates = first.updates  # informational: the inputs' updates, summed
    del first
    for path in paths[1:]:
        m = read_matrix(path, "merge input")
        check_compatible(
            m, vocab_size=result.vocab_size, candidates=result.candidates, tokenizer=result.tokenizer,
            what="merge input", path=path, against=f"the first input {paths[0]!r}",
        )
        taken.append(merge_into(result, m))
        result.updates += m.updates
    write_matrix(out, result)
    return result, taken
