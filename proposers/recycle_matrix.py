"""Token recycling's adjacency matrix on disk: saved atomically, refused when foreign or corrupt.

Format (version 1): a NumPy ``.npz`` archive read with ``allow_pickle=False``
(no object arrays, nothing is unpickled) holding three arrays:

- ``ids``: int32 ``[vocab_size, candidates]``, the target's top candidates after
  each token, best first; -1 where nothing was recorded yet;
- ``probs``: float16 ``[vocab_size, candidates]``, the probability the target
  gave each candidate when it was recorded;
- ``meta``: uint8, UTF-8 JSON with ``format`` ("freespec-recycle-matrix"),
  ``version`` (1), ``vocab_size``, ``candidates``, ``tokenizer`` (the vocabulary
  fingerprint, ``freespec.proposers.vocab``), ``model`` (informational),
  ``updates`` and ``sha256`` (of the ``ids`` then ``probs`` bytes).

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

import numpy as np

FORMAT = "freespec-recycle-matrix"
VERSION = 1


class MatrixFileError(ValueError):
    """A matrix file that must not be used (the message says which file and why)."""


def _digest(ids: np.ndarray, probs: np.ndarray) -> str:
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(ids).tobytes())
    h.update(np.ascontiguousarray(probs).tobytes())
    return h.hexdigest()


def save_matrix(path: str, ids: np.ndarray, probs: np.ndarray, *, tokenizer: str, model: str = "", updates: int = 0):
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    probs = np.ascontiguousarray(probs, dtype=np.float16)
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "vocab_size": int(ids.shape[0]),
        "candidates": int(ids.shape[1]),
        "tokenizer": tokenizer,
        "model": model,
        "updates": int(updates),
        "sha256": _digest(ids, probs),
    }
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".recycle-", suffix=".npz.tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, ids=ids, probs=probs, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_matrix(path: str, *, vocab_size: int, candidates: int, tokenizer: str) -> tuple[np.ndarray, np.ndarray, dict]:
    """Read and check a matrix file; any doubt raises ``MatrixFileError`` naming the file and the reason."""

    def refuse(why: str) -> MatrixFileError:
        return MatrixFileError(f"recycle matrix_path {path!r}: {why}")

    try:
        with np.load(path, allow_pickle=False) as z:
            names = set(z.files)
            if not {"ids", "probs", "meta"} <= names:
                raise refuse(f"not a {FORMAT} file (arrays {sorted(names)})")
            meta = json.loads(z["meta"].tobytes().decode())
            ids, probs = z["ids"], z["probs"]
    except MatrixFileError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, KeyError, UnicodeDecodeError) as e:
        raise refuse(f"unreadable or corrupt ({type(e).__name__}: {e})") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise refuse(f"not a {FORMAT} file")
    if meta.get("version") != VERSION:
        raise refuse(f"format version {meta.get('version')!r}, this freespec reads version {VERSION}")
    if meta.get("tokenizer") != tokenizer:
        raise refuse(
            f"learned with another tokenizer (file {meta.get('tokenizer')!r}, model {meta.get('model')!r}; "
            f"this server's tokenizer is {tokenizer!r})"
        )
    if meta.get("vocab_size") != vocab_size or ids.shape != (vocab_size, meta.get("candidates")):
        raise refuse(f"vocabulary size {meta.get('vocab_size')} (ids {ids.shape}), this model has {vocab_size}")
    if meta.get("candidates") != candidates:
        raise refuse(f"holds {meta.get('candidates')} candidates per token, the option `candidates` is {candidates}")
    if ids.dtype != np.int32 or probs.dtype != np.float16 or probs.shape != ids.shape:
        raise refuse(f"wrong array types ({ids.dtype} {ids.shape}, {probs.dtype} {probs.shape})")
    if _digest(ids, probs) != meta.get("sha256"):
        raise refuse("checksum mismatch (the file was modified or truncated)")
    if ids.size and (ids.min() < -1 or ids.max() >= vocab_size):
        raise refuse("token ids outside the vocabulary")
    return np.array(ids), np.array(probs), meta
