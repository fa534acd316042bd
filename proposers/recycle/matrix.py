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
of one. The file's mode follows the umask (0644 under 022), so a replica running
as another user can read it.

Reading checks every size before it allocates or inflates anything: the file's
size, each member's declared size and its ``.npy`` header (dtype, shape) against
the header fields and, when loading for a server, against its vocabulary and
``candidates`` (else ``MAX_VOCAB`` x ``MAX_CANDIDATES``). A ``.npy`` file renamed
``.npz`` is named as such. Only a regular file is opened (``freespec.safe_files``: a FIFO is refused, never
waited on); each ``.npy`` header's length is bounded before it is read; ``meta`` is JSON of at most
``MAX_META_BYTES`` nested at most ``MAX_META_DEPTH``; ``probs`` must be finite, in [0, 1], and ``stamps`` at
most ``MAX_CLOCK_AHEAD_S`` ahead of this clock (a row stamped later would win every merge).

A save's temporary file carries the writer's pid and the target's name; the next save of that target removes
those of a process that is gone (never another target's, whose pid may be another PID namespace's) (a killed save leaves nothing for good), and the folder is fsynced after the rename.
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
import zipfile
import zlib
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from freespec import confined
from freespec.proposers.learned.state_dir import CLOCK_SLACK_S
from freespec.safe_files import check_npy_header, clip, loads_json, open_regular, process_alive, short

FORMAT = "freespec-recycle-matrix"
VERSION = 2
READABLE_VERSIONS = (1, 2)
STAMP_MAX = np.iinfo(np.uint32).max
# Bounds on a file read without a configured size (``freespec recycle merge/info``): the largest vocabulary
# (4,194,304 tokens; real ones are below 300,000) and ``RecycleOptions.candidates``' upper bound.
MAX_VOCAB = 1 << 22
MAX_CANDIDATES = 32
MAX_META_BYTES = 1 << 20
MAX_META_DEPTH = 8  # the header is a flat object; a deeper one is refused before it is walked
# A row's stamp may be at most this far ahead of this server's clock (seconds): a peer whose clock (or file)
# says later would win every merge for good (2**32 - 1 wins against every real stamp).
MAX_CLOCK_AHEAD_S = int(CLOCK_SLACK_S)  # the one skew allowed between replicas (``state_dir``)


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
    perms: Optional[int] = None,
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
    base = os.path.basename(path)
    remove_stale_temporaries(directory, base)
    tmp = f".recycle-{os.getpid()}-{base}-{secrets.token_hex(4)}.npz.tmp"

    def fill(f) -> None:
        np.savez(f, ids=ids, probs=probs, stamps=stamps, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))

    # A matrix is shared with replicas (merge_from) that may run as another user, so it gets the mode any new
    # file gets under this process's umask (0644 under the usual 022); a state directory's stays 0600
    # (``perms``). Written whole or not at all, no link followed (``freespec.confined``).
    confined.write_atomic(path, tmp, fill, 0o666 if perms is None else perms)


def remove_stale_temporaries(directory: str, base: str) -> None:
    """Remove temporary files a killed save of ``base`` left in ``directory`` (of a process now gone). Only
    ``base``'s: another writer's, maybe in another PID namespace where its pid means another process, is
    never touched."""
    names = [n for n, _ in confined.entries(directory) if n.startswith(".recycle-") and n.endswith(".npz.tmp")]
    for name in names:
        pid, _, rest = name[len(".recycle-"):].partition("-")
        if not rest.startswith(base + "-"):
            continue
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            try:
                confined.unlink(os.path.join(directory, name))
            except OSError:
                pass



def write_matrix(path: str, m: Matrix, perms: Optional[int] = None) -> None:
    save_matrix(path, m.ids, m.probs, m.stamps, tokenizer=m.tokenizer, model=m.model, updates=m.updates,
                perms=perms)


def read_matrix(
    path: str, what: str = "recycle matrix", *, vocab_size: Optional[int] = None, candidates: Optional[int] = None,
    tokenizer: Optional[str] = None, against: str = "this server",
) -> Matrix:
    """Read a matrix file and check that it is whole and well-formed; any doubt raises ``MatrixFileError``.

    The error names ``what`` (the option or argument), the file and the reason. Given ``vocab_size``,
    ``candidates`` or ``tokenizer`` (``load_matrix``), the file's header fields must match them, checked
    before any array is read; otherwise its arrays are bounded by ``MAX_VOCAB`` x ``MAX_CANDIDATES``. Every
    size is checked before memory is allocated or a compressed member inflated: the file's size, each
    member's declared uncompressed size and its ``.npy`` header's shape and dtype (no object arrays).
    """

    def refuse(why: str) -> MatrixFileError:
        return MatrixFileError(f"{what} {path!r}: {why}")

    rows_max = MAX_VOCAB if vocab_size is None else int(vocab_size)
    cols_max = MAX_CANDIDATES if candidates is None else int(candidates)
    try:
        with open_regular(path, "rb") as f:
            magic = f.read(6)
            if magic == b"\x93NUMPY":
                raise refuse("is a single .npy array (a file renamed .npz?), not a .npz matrix archive; "
                             "write matrices with freespec (matrix_path, `freespec recycle merge`)")
            if magic[:4] != b"PK\x03\x04":
                raise refuse(f"not a {FORMAT} file (not a .npz archive)")
            size, limit = os.fstat(f.fileno()).st_size, _file_limit(rows_max, cols_max)
            if size > limit:
                raise refuse(f"{size} bytes, more than a matrix of at most {rows_max} tokens x {cols_max} "
                             f"candidates can take ({limit} bytes)")
            f.seek(0)
            with zipfile.ZipFile(f) as z:
                names = {info.filename for info in z.infolist()}
                if len(names) > 8 or not {"ids.npy", "probs.npy", "meta.npy"} <= names:
                    raise refuse(f"not a {FORMAT} file (arrays {short(sorted(n.removesuffix('.npy') for n in names)[:8])})")
                meta_bytes = _member(z, "meta", np.uint8, lambda s: len(s) == 1 and s[0] <= MAX_META_BYTES,
                                     refuse, f"one dimension of at most {MAX_META_BYTES} bytes")
                meta = loads_json(meta_bytes.tobytes().decode(), what="its 'meta'", max_depth=MAX_META_DEPTH)
                if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                    raise refuse(f"not a {FORMAT} file")
                version = meta.get("version")
                if version not in READABLE_VERSIONS:
                    raise refuse(f"format version {short(version)}, this freespec reads versions {list(READABLE_VERSIONS)}")
                v, c = meta.get("vocab_size"), meta.get("candidates")
                if not _count(v, rows_max if vocab_size is None else None) or not _count(c, cols_max if candidates is None else None):
                    raise refuse(f"field 'vocab_size'/'candidates' ({short(v)}, {short(c)}) must be integers in "
                                 f"[1, {rows_max}] and [1, {cols_max}]")
                _check_fields(str(meta.get("tokenizer")), str(meta.get("model", "")), v, c, vocab_size=vocab_size,
                              candidates=candidates, tokenizer=tokenizer, refuse=refuse, against=against)
                shape = (v, c)
                ids = _member(z, "ids", np.int32, lambda s: s == shape, refuse, f"{shape} (fields 'vocab_size', 'candidates')")
                probs = _member(z, "probs", np.float16, lambda s: s == shape, refuse, f"{shape} like 'ids'")
                stamps = None
                if "stamps.npy" in names:
                    stamps = _member(z, "stamps", np.uint32, lambda s: s == (v,), refuse, f"({v},)")
    except MatrixFileError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, zlib.error, EOFError, KeyError, UnicodeDecodeError) as e:
        raise refuse(f"unreadable or corrupt ({type(e).__name__}: {clip(str(e))})") from e
    if version == 1:
        digest, stamps = _digest(ids, probs), default_stamps(ids)
    else:
        if stamps is None:
            raise refuse("array 'stamps' missing")
        digest = _digest(ids, probs, stamps)
    if digest != meta.get("sha256"):
        raise refuse("checksum mismatch (the file was modified or truncated)")
    if ids.size and (ids.min() < -1 or ids.max() >= ids.shape[0]):
        raise refuse("token ids outside the vocabulary")
    if probs.size and not (np.isfinite(probs).all() and probs.min() >= 0 and probs.max() <= 1):
        raise refuse("array 'probs' holds values that are not probabilities (NaN, inf, or outside [0, 1])")
    ahead = int(time.time()) + MAX_CLOCK_AHEAD_S
    if stamps.size and int(stamps.max()) > ahead:
        raise refuse(f"array 'stamps' holds a stamp of {int(stamps.max())} (Unix seconds), more than "
                     f"{MAX_CLOCK_AHEAD_S} s ahead of this clock: it would win every merge")
    return Matrix(
        ids, probs, stamps, str(meta.get("tokenizer")),
        str(meta.get("model", "")), int(meta.get("updates", 0)) if isinstance(meta.get("updates"), int) else 0, meta,
    )


def _count(value, bound: Optional[int]) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1 and (bound is None or value <= bound)


def _file_limit(rows: int, cols: int) -> int:
    """The most bytes a matrix file of ``rows`` x ``cols`` may take (stored, uncompressed: the largest form)."""
    return 6 * rows * cols + 4 * rows + MAX_META_BYTES + (1 << 16)


def _member(z: zipfile.ZipFile, name: str, dtype, shape_ok, refuse, expected: str) -> np.ndarray:
    """One ``.npy`` member, its header checked (dtype, shape, declared size) before its data is inflated or allocated."""
    info = z.getinfo(f"{name}.npy")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise refuse(f"array {name!r} uses an unsupported compression ({info.compress_type})")
    with z.open(info) as m:
        try:
            head = check_npy_header(m)  # the header's length bounded before numpy reads it
        except ValueError as e:
            raise refuse(f"array {name!r}: {e}") from None
        version = np.lib.format.read_magic(head)
        if version == (1, 0):
            shape, fortran, dt = np.lib.format.read_array_header_1_0(head)
        elif version == (2, 0):
            shape, fortran, dt = np.lib.format.read_array_header_2_0(head)
        else:
            raise refuse(f"array {name!r}: .npy format version {version} is not read here")
        dt = np.dtype(dt)
        if dt != np.dtype(dtype).newbyteorder("<") or fortran:
            raise refuse(f"wrong array types: {name!r} is {dt}{' (Fortran order)' if fortran else ''}, "
                         f"expected {np.dtype(dtype)}")
        if not shape_ok(tuple(shape)):
            raise refuse(f"array {name!r} has shape {tuple(shape)}, expected {expected}")
        out = np.empty(shape, dtype=np.dtype(dtype).newbyteorder("<"))
        if info.file_size > out.nbytes + (1 << 16):
            raise refuse(f"array {name!r} declares {info.file_size} bytes for {out.nbytes} bytes of data")
        view, done = memoryview(out.reshape(-1)).cast("B"), 0
        while done < out.nbytes:
            got = m.readinto(view[done:])
            if not got:
                raise refuse(f"array {name!r} is truncated ({done} of {out.nbytes} bytes)")
            done += got
    return out


def check_compatible(
    m: Matrix, *, vocab_size: int, candidates: int, tokenizer: str, what: str, path: str, against: str = "this server"
) -> None:
    """Refuse a matrix learned for another vocabulary, naming the field that differs."""

    def refuse(why: str) -> MatrixFileError:
        return MatrixFileError(f"{what} {path!r}: {why}")

    _check_fields(m.tokenizer, m.model, m.vocab_size, m.candidates, vocab_size=vocab_size, candidates=candidates,
                  tokenizer=tokenizer, refuse=refuse, against=against)


def _check_fields(theirs: str, model: str, v: int, c: int, *, vocab_size, candidates, tokenizer, refuse, against) -> None:
    if tokenizer is not None and theirs != tokenizer:
        raise refuse(
            f"learned with another tokenizer: field 'tokenizer' is {short(theirs)} (model {short(model)}), "
            f"{against}'s tokenizer is {tokenizer!r}"
        )
    if vocab_size is not None and v != vocab_size:
        raise refuse(f"field 'vocab_size' is {v} (vocabulary size), {against} has {vocab_size}")
    if candidates is not None and c != candidates:
        raise refuse(f"field 'candidates' is {c} per token, {against}'s option `candidates` is {candidates}")


def load_matrix(path: str, *, vocab_size: int, candidates: int, tokenizer: str, what: str = "recycle matrix_path") -> Matrix:
    """Read a matrix file and check it belongs to this vocabulary; any doubt raises ``MatrixFileError``.

    The header fields are compared before any array is read, so a file of another size allocates nothing.
    """
    return read_matrix(path, what, vocab_size=vocab_size, candidates=candidates, tokenizer=tokenizer)


def clear_rows_up_to(m: Matrix, stamp: int) -> int:
    """Empty the rows of ``m`` stamped at or before ``stamp`` (a purge, ``proposers.learned.purges``); how many."""
    if stamp <= 0:
        return 0
    gone = (m.stamps > 0) & (m.stamps <= stamp)
    m.ids[gone] = -1
    m.probs[gone] = 0
    m.stamps[gone] = 0
    return int(gone.sum())


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


@dataclass
class Rows:
    """Some rows of a matrix, each token id once: the unit ``recycle`` shares through Redis
    (``proposers.recycle.shared_rows``), merged by the same rule as whole matrices."""

    rows: np.ndarray  # int64 [n], unique token ids
    ids: np.ndarray  # int32 [n, candidates]
    probs: np.ndarray  # float16 [n, candidates]
    stamps: np.ndarray  # uint32 [n]

    def __len__(self) -> int:
        return int(len(self.rows))

    def keep(self, mask: np.ndarray) -> "Rows":
        return Rows(self.rows[mask], self.ids[mask], self.probs[mask], self.stamps[mask])


def rows_of(m: Matrix, rows: np.ndarray) -> Rows:
    """Copies of ``m``'s ``rows`` (unique token ids), those ever written only."""
    rows = np.asarray(rows, dtype=np.int64)
    rows = rows[(m.stamps[rows] > 0) & (m.ids[rows, 0] >= 0)]
    return Rows(rows, m.ids[rows].copy(), m.probs[rows].copy(), m.stamps[rows].copy())


def newest_rows(parts: list[Rows]) -> Rows:
    """``parts`` as one ``Rows``, each token id once: its newest row (on equal stamps, the later part's)."""
    if len(parts) == 1:
        return parts[0]
    rows = np.concatenate([p.rows for p in parts])
    stamps = np.concatenate([p.stamps for p in parts]).astype(np.int64)
    order = np.lexsort((-np.arange(len(rows)), -stamps, rows))  # by row, newest first, then the later part
    first = np.ones(len(order), dtype=bool)
    first[1:] = rows[order][1:] != rows[order][:-1]
    pick = order[first]
    return Rows(rows[pick], np.concatenate([p.ids for p in parts])[pick],
                np.concatenate([p.probs for p in parts])[pick], stamps[pick].astype(np.uint32))


def merge_rows(dst: Matrix, src: Rows) -> int:
    """Merge ``src`` (each token id once) into ``dst`` in place by ``merge_into``'s rule (the newest row wins, a
    row never written never wins); how many rows were taken."""
    take = (src.stamps > dst.stamps[src.rows]) & (src.ids[:, 0] >= 0)
    rows = src.rows[take]
    dst.ids[rows] = src.ids[take]
    dst.probs[rows] = src.probs[take]
    dst.stamps[rows] = src.stamps[take]
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
        m = read_matrix(path, "merge input", vocab_size=result.vocab_size, candidates=result.candidates,
                        tokenizer=result.tokenizer, against=f"the first input {paths[0]!r}")
        taken.append(merge_into(result, m))
        result.updates += m.updates
    write_matrix(out, result)
    return result, taken
