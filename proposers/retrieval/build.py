"""Build a retrieval datastore (the format of ``freespec.proposers.retrieval.datastore``) from text files.

Engine-agnostic: the caller passes a batched ``tokenize(list[str]) -> list[list[int]]``.

Inputs are read by ``freespec.proposers.retrieval.readers`` (the formats, ``roles`` and ``exclude``).

Documents are tokenized in batches and appended to the current shard, each followed by
``SEPARATOR``; a document that does not fit in what is left of the shard starts the next one
(only a document longer than a whole shard is cut). A full shard is written (``.tokens``),
its suffix array computed with libdivsufsort (``pydivsufsort``) and written (``.sa``), and
its memory released: only one shard is in memory at a time. Everything is built in a
temporary directory next to the output (``.NAME.building-PID-XXXX``, held under ``flock`` while the
build runs) and moved into place once the manifest, written last, is on disk: renamed in, or, over an
existing datastore (``force``), swapped with it in one ``renameat2(RENAME_EXCHANGE)`` so that a reader
finds the old datastore or the new one at the path, never neither. Work folders of builds that are gone
(killed: their lock is free and their pid dead, or an hour old) are removed by the next build.
"""
from __future__ import annotations

import ctypes
import errno
import hashlib
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from freespec.safe_files import clip, create_new, fsync_directory, printable, process_alive
from freespec.proposers.retrieval.datastore import FORMAT, MANIFEST, SEPARATOR, VERSION
from freespec.proposers.retrieval.readers import (
    EXCLUDE_NGRAM,
    BuildError,
    InputError,
    canonical_roles,
    exclusion_filter,
    expand_inputs,
    read_file,
)

__all__ = ["build_datastore", "suffix_array"]

_MAX_SHARD_TOKENS = int(SEPARATOR)  # positions in the .sa file are uint32
_WRITE_CHUNK = 1 << 22  # elements per write / sha256 update
_BATCH_DOCS = 1024
_BATCH_CHARS = 1 << 18  # characters handed to the tokenizer at once (with PIECE_CHARS, bounds its memory)
_SHOWN_BAD_RECORDS = 20
# docs/datastore.md, "Memory": a build's peak above the process at start is at most about
# SHARD_BYTES_PER_TOKEN x shard_tokens + MEMORY_BOUND_BYTES, whatever the input's shape (tests check it).
SHARD_BYTES_PER_TOKEN = 21  # 4 for the shard buffer, 16 for libdivsufsort's array, write buffers
MEMORY_BOUND_BYTES = 96 << 20  # the tokenizer on _BATCH_CHARS + reading (1 MiB chunks, 64 Ki pieces, a record)
_ANNOUNCE_TOKENS = 1 << 24


# --------------------------------------------------------------------------- suffix arrays


def _aligned_positions(byte_sa: np.ndarray, chunk: int = 1 << 20) -> Iterator[np.ndarray]:
    """The token positions (byte offsets divisible by 4) in the byte-level suffix array, in its order."""
    for start in range(0, len(byte_sa), chunk):
        part = byte_sa[start : start + chunk]
        yield (part[(part & 3) == 0] >> 2).astype("<u4")


def _byte_suffix_array(tokens: np.ndarray) -> np.ndarray:
    """libdivsufsort on the big-endian bytes of ``tokens`` (modified in place, restored before returning).

    Comparing two suffixes that start at multiples of 4 byte by byte is comparing their uint32
    sequences (big-endian: the most significant byte first; a suffix that is a prefix of the other
    comes first in both). This is what ``pydivsufsort.divsufsort`` does with a uint32 array, without
    its copies of the input and of the filtered output.
    """
    from pydivsufsort import divsufsort

    tokens.byteswap(inplace=True)  # native little-endian -> big-endian bytes
    try:
        return divsufsort(tokens.view(np.uint8))
    finally:
        tokens.byteswap(inplace=True)


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """Suffix array (uint32 start positions, suffixes in lexicographic order) of a uint32 token array."""
    tokens = np.ascontiguousarray(tokens, dtype="<u4").copy()
    if len(tokens) == 0:
        return np.zeros(0, "<u4")
    if len(tokens) > _MAX_SHARD_TOKENS:
        raise BuildError(f"{len(tokens)} tokens: a suffix array holds at most {_MAX_SHARD_TOKENS} positions")
    out = np.concatenate(list(_aligned_positions(_byte_suffix_array(tokens))))
    assert len(out) == len(tokens)
    return out


# --------------------------------------------------------------------------- building


def _write_array(path: Path, chunks: Iterable[np.ndarray]) -> tuple[int, str]:
    """Write little-endian uint32 chunks to ``path`` (fsynced); return (elements, sha256)."""
    digest = hashlib.sha256()
    count = 0
    with create_new(path, "wb") as f:
        for chunk in chunks:
            data = memoryview(np.ascontiguousarray(chunk, dtype="<u4")).cast("B")
            f.write(data)
            digest.update(data)
            count += len(chunk)
        f.flush()
        os.fsync(f.fileno())
    return count, digest.hexdigest()


def _chunks(array: np.ndarray, size: int = _WRITE_CHUNK) -> Iterator[np.ndarray]:
    for start in range(0, len(array), size):
        yield array[start : start + size]


class _ShardWriter:
    """Fills one shard buffer with documents; writes the shard and its suffix array when it is full."""

    def __init__(self, directory: Path, capacity: int, log: Callable[[str], None]) -> None:
        self.directory = directory
        self.capacity = capacity
        self.log = log
        self.buffer = np.empty(capacity, dtype="<u4")  # pages are touched only as tokens arrive
        self.used = 0
        self.documents = 0  # documents ended (separators written)
        self.open = False  # a document's first pieces are in, its last is to come
        self.doc_start = 0  # where the current document starts in the buffer
        self.entries: list[dict] = []
        self.sort_seconds = 0.0

    def add(self, ids: np.ndarray, end: bool = True) -> None:
        """Append one document's ids (uint32), or a piece of it (``end`` False: more follows), and after its
        last piece the separator."""
        if not self.open:
            self.doc_start = self.used
        if self.doc_start and self.used + len(ids) + end > self.capacity:
            self._move_document()  # whole documents stay in one shard when they fit in one
        start = 0
        while len(ids) - start > self.capacity - self.used:  # longer than a whole shard: cut it
            take = self.capacity - self.used
            self.buffer[self.used : self.capacity] = ids[start : start + take]
            self.used = self.capacity
            start += take
            self.flush()
            self.doc_start = 0
        rest = ids[start:]
        self.buffer[self.used : self.used + len(rest)] = rest
        self.used += len(rest)
        self.open = not end
        if end:
            self._separator()

    def end_document(self) -> None:
        """End a document whose last pieces will not come (dropped or bad): its separator now."""
        if self.open:
            self.open = False
            self._separator()

    def _separator(self) -> None:
        self.documents += 1
        if self.used == self.capacity:
            self.flush()
        self.buffer[self.used] = SEPARATOR
        self.used += 1
        if self.used == self.capacity:
            self.flush()

    def _move_document(self) -> None:
        """Write the shard up to the open document's start; the document's pieces so far begin the next one."""
        begun, self.used = self.used, self.doc_start
        self.flush()
        self.buffer[: begun - self.doc_start] = self.buffer[self.doc_start : begun]
        self.used, self.doc_start = begun - self.doc_start, 0

    def flush(self) -> None:
        n = self.used
        if n == 0:
            return
        name = f"shard-{len(self.entries):05d}"
        tokens = self.buffer[:n]
        written, tokens_sha = _write_array(self.directory / f"{name}.tokens", _chunks(tokens))
        if n >= _ANNOUNCE_TOKENS:  # the sort takes a while: say what is going on
            self.log(f"{name}: {n:,} tokens written; sorting suffixes")
        start = time.perf_counter()
        byte_sa = _byte_suffix_array(tokens)
        sorted_at = time.perf_counter()
        sa_count, sa_sha = _write_array(self.directory / f"{name}.sa", _aligned_positions(byte_sa))
        del byte_sa
        seconds = time.perf_counter() - start
        self.sort_seconds += seconds
        if written != n or sa_count != n:
            raise BuildError(f"{name}: wrote {written} tokens and {sa_count} suffix-array entries, not {n}")
        self.log(
            f"{name}: {n:,} tokens, suffix array in {seconds:.1f}s (divsufsort {sorted_at - start:.1f}s, "
            f"{n / max(seconds, 1e-9) / 1e6:.2f}M tokens/s)"
        )
        self.entries.append({"name": name, "tokens": n, "tokens_sha256": tokens_sha, "sa_sha256": sa_sha})
        self.used = 0


def _datastore_files(directory: Path) -> tuple[list[Path], list[Path]]:
    """(files a datastore holds, anything else) in ``directory``."""
    ours, other = [], []
    for path in sorted(directory.iterdir()):
        known = path.name == MANIFEST or path.suffix in (".tokens", ".sa")
        if known and path.is_file() and not path.is_symlink():
            ours.append(path)
        else:
            other.append(path)
    return ours, other


def _check_out_dir(out: Path, force: bool) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise BuildError(f"{out} exists and is not a directory")
    if not out.exists() or not any(out.iterdir()):
        return
    if not force:
        raise BuildError(f"{out} is not empty; pass --force (force=True) to replace the datastore in it")
    _, other = _datastore_files(out)
    if other:
        names = ", ".join(p.name for p in other[:5]) + (", ..." if len(other) > 5 else "")
        raise BuildError(
            f"{out} holds files that are not part of a datastore ({names}); "
            "refusing to replace it, even with --force: choose another --out"
        )


# --------------------------------------------------------------------------- moving a build into place

_WORK = ".building-"  # f".{NAME}.building-{pid}-{random}": a build's work folder, flock-ed while it runs
_OLD = ".old-"  # side folders of freespec versions that replaced a datastore in two renames
DEBRIS_AGE_S = 3600.0  # a work folder whose pid is alive (reused?) and whose lock is free: removed after this
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap the directories ``a`` and ``b`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``).

    False where the platform, C library or filesystem cannot; any other failure raises ``OSError``.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a C library before glibc 2.28
        return False
    at_cwd = -100
    if renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(code, f"cannot swap {a} with {b}: {os.strerror(code)}")


def _lock_dir(path: Path) -> int:
    """An open descriptor of directory ``path`` with an exclusive ``flock`` on it (held until it is closed)."""
    import fcntl

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _work_dir(out: Path) -> tuple[Path, int]:
    """A new work folder beside ``out``, locked: (its path, the descriptor holding the lock)."""
    path = Path(tempfile.mkdtemp(prefix=f".{out.name}{_WORK}{os.getpid()}-", dir=out.parent))
    return path, _lock_dir(path)


def _writer_gone(path: Path, prefix: str) -> bool:
    """Whether the build that made work folder ``path`` is gone: its pid dead, or the folder an hour old."""
    pid = path.name[len(prefix):].split("-", 1)[0]
    if pid.isdigit() and not process_alive(int(pid)):
        return True
    try:
        return time.time() - path.lstat().st_mtime > DEBRIS_AGE_S
    except OSError:
        return False


def clean_debris(out: Path, log: Callable[[str], None] = lambda message: None) -> list[Path]:
    """Remove what killed builds of ``out`` left beside it; returns the folders removed.

    Only freespec's own folders, known by name (``.NAME.building-*``, ``.NAME.old-*``), real directories
    (never a link), whose lock is free (no build holds them) and whose writer is gone; a live build of the
    same datastore in another process keeps its work folder.
    """
    removed = []
    work_prefix, old_prefix = f".{out.name}{_WORK}", f".{out.name}{_OLD}"
    try:
        names = sorted(os.listdir(out.parent))
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(work_prefix) or name.startswith(old_prefix)):
            continue
        path = out.parent / name
        try:
            fd = _lock_dir(path)  # a link or a file: ELOOP / ENOTDIR, left alone
        except OSError:
            continue
        try:
            if name.startswith(old_prefix) or _writer_gone(path, work_prefix):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
                log(f"removed {path}, left by a build that did not finish")
        finally:
            os.close(fd)
    return removed


def _move_into_place(work: Path, out: Path) -> None:
    """Put the finished datastore ``work`` at ``out``: renamed in, or swapped in one step with the old one."""
    if not out.exists():
        try:
            work.rename(out)
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise BuildError(f"{out} appeared while the datastore was built; build again (--force replaces it)") \
                    from None
            raise
        return
    if _exchange(work, out):
        shutil.rmtree(work, ignore_errors=True)  # the old datastore, now at the work folder's name
        return
    # No atomic swap here (not Linux, or a filesystem without RENAME_EXCHANGE): two renames. A kill between
    # them leaves the old datastore in a locked side folder that the next build removes.
    aside, fd = _work_dir(out)
    try:
        out.rename(aside / "previous")
        try:
            work.rename(out)
        except BaseException:
            (aside / "previous").rename(out)  # a failed --force build leaves the old datastore in place
            raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)
        os.close(fd)


def _ids_array(ids_lists: Sequence[Sequence[int]], vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(all ids as uint32, document end offsets); BuildError on ids outside [0, vocab_size)."""
    lengths = np.fromiter((len(ids) for ids in ids_lists), dtype=np.int64, count=len(ids_lists))
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    flat = np.fromiter(itertools.chain.from_iterable(ids_lists), dtype=np.int64, count=total)
    if total:
        low, high = int(flat.min()), int(flat.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise BuildError(f"the tokenizer returned token id {bad}, outside [0, vocab_size={vocab_size})")
    return flat.astype("<u4"), ends


def build_datastore(
    inputs: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    tokenize: Callable[[list[str]], Sequence[Sequence[int]]],
    *,
    tokenizer_name: str,
    fingerprint: str,
    vocab_size: int,
    shard_tokens: int = 1 << 26,
    progress: bool = True,
    force: bool = False,
    roles: Sequence[str] | None = None,
    exclude: Sequence[str | os.PathLike] = (),
    skip_bad_records: bool = False,
) -> dict:
    """Tokenize ``inputs`` into a datastore at ``out_dir``; return its manifest.

    ``tokenize`` maps a batch of texts to their token ids (no special tokens). ``shard_tokens``
    bounds a shard (documents plus separators); memory while building is about 4 bytes per
    shard token for the buffer plus 16 for libdivsufsort's byte-level suffix array (32 above
    536,870,911 tokens per shard), and at most ``MEMORY_BOUND_BYTES`` more whatever the input's shape
    (documents are tokenized in bounded pieces, ``readers``). A non-empty ``out_dir`` is refused unless ``force``, and even
    then only when it holds nothing but datastore files. ``roles`` and ``exclude``: see the
    module docstring. A bad record (invalid JSON, no text, a lone surrogate, a text the tokenizer refuses)
    stops the build with an ``InputError`` naming its file and line (or record), or, with
    ``skip_bad_records``, is skipped and counted (``skipped_records`` in the manifest).
    """
    paths = expand_inputs(inputs)
    if not paths:
        raise BuildError("no input files")
    wanted = canonical_roles(roles)
    if not 2 <= int(shard_tokens) <= _MAX_SHARD_TOKENS:
        raise BuildError(f"shard_tokens must be between 2 and {_MAX_SHARD_TOKENS}, not {shard_tokens}")
    if not 0 < int(vocab_size) <= int(SEPARATOR):
        raise BuildError(f"vocab_size must be between 1 and {int(SEPARATOR)}, not {vocab_size}")
    out = Path(out_dir).absolute()
    _check_out_dir(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)

    from tqdm import tqdm

    def log(message: str) -> None:
        if progress:
            tqdm.write(f"freespec: {printable(message)}", file=sys.stderr)

    def warn(message: str) -> None:
        tqdm.write(f"freespec: warning: {printable(message)}", file=sys.stderr)

    keep = exclusion_filter(exclude, warn=warn) if exclude else None
    dropped = 0
    skipped: list[str] = []

    def refuse(error: InputError) -> None:
        """A bad record: the build stops naming it, or (``skip_bad_records``) it is skipped and counted."""
        if not skip_bad_records:
            raise error
        skipped.append(str(error))
        if len(skipped) <= _SHOWN_BAD_RECORDS:
            warn(f"skipped a bad record: {error}")

    bad = refuse if skip_bad_records else None

    started = time.perf_counter()
    clean_debris(out, log)
    work, lock = _work_dir(out)
    try:
        writer = _ShardWriter(work, int(shard_tokens), log)
        documents = 0
        total_bytes = sum(p.stat().st_size for p in paths)
        with tqdm(total=total_bytes, desc="tokenizing", unit="B", unit_scale=True, unit_divisor=1024,
                  file=sys.stderr, disable=not progress, dynamic_ncols=True) as bar:

            def tokenized(batch: list[tuple[str | None, bool, str]]) -> list[np.ndarray | None]:
                """Each text's ids (None for a text the tokenizer refused and ``bad`` skipped)."""
                items = [(text, where) for text, _, where in batch if text is not None]
                texts = [text for text, _ in items]
                try:
                    ids_lists = list(tokenize(texts)) if texts else []
                except BuildError:
                    raise
                except Exception as batch_error:  # noqa: BLE001 - a tokenizer refusing one text: find it, name it
                    ids_lists, refused = [], []
                    for text, where in items:
                        try:
                            ids_lists.append(tokenize([text])[0])
                        except BuildError:
                            raise
                        except Exception as e:  # noqa: BLE001
                            refused.append((where, e))
                            ids_lists.append(None)
                    if len(items) > 1 and len(refused) == len(items):
                        raise batch_error  # every text refused: the tokenizer, not a record, is at fault
                    for where, e in refused:
                        refuse(InputError(f"{where}: the tokenizer refused this text ({type(e).__name__}: "
                                          f"{clip(str(e))})"))
                if len(ids_lists) != len(texts):
                    raise BuildError(f"tokenize returned {len(ids_lists)} results for {len(texts)} texts")
                good = [ids for ids in ids_lists if ids is not None]
                flat, ends = _ids_array(good, int(vocab_size))
                arrays = iter(np.split(flat, ends[:-1]) if len(good) else [])
                return [None if ids is None else next(arrays) for ids in ids_lists]

            def run_batch(batch: list[tuple[str | None, bool, str]], nbytes: int) -> None:
                arrays = iter(tokenized(batch))
                for text, end, _ in batch:
                    ids = None if text is None else next(arrays)
                    if ids is None:  # a piece dropped or refused: its document ends before it
                        writer.end_document()
                    else:
                        writer.add(ids, end)
                bar.update(nbytes)
                tokens = sum(e["tokens"] for e in writer.entries) + writer.used
                bar.set_postfix_str(f"{writer.documents:,} docs, {tokens:,} tokens", refresh=False)

            batch: list[tuple[str | None, bool, str]] = []
            chars = pending = 0
            for path in paths:
                for piece in read_file(path, wanted, warn, bad):
                    pending += piece.nbytes
                    if piece.text and keep is not None and not keep(piece.text):
                        dropped += 1
                        batch.append((None, True, piece.where))
                    elif piece.text:
                        batch.append((piece.text, piece.end, piece.where))
                        chars += len(piece.text)
                    elif piece.end and piece.text is None:
                        batch.append((None, True, piece.where))  # a document cut short by a skipped record
                    if len(batch) >= _BATCH_DOCS or chars >= _BATCH_CHARS:
                        run_batch(batch, pending)
                        batch, chars, pending = [], 0, 0
            run_batch(batch, pending)
        documents = writer.documents
        if documents == 0:
            raise BuildError(f"no documents in {', '.join(str(p) for p in paths)} (every text is empty)")
        writer.flush()
        writer.buffer = None  # release the shard buffer

        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "tokenizer": {"name": tokenizer_name, "fingerprint": fingerprint},
            "vocab_size": int(vocab_size),
            "separator": int(SEPARATOR),
            "shards": writer.entries,
            "total_tokens": sum(e["tokens"] for e in writer.entries),
            "documents": documents,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "sources": [str(Path(p).absolute()) for p in inputs],  # directories as given
            "roles": sorted(wanted) if wanted else None,
            "excluded": {"files": [str(Path(p).absolute()) for p in exclude], "ngram_words": EXCLUDE_NGRAM,
                         "documents_dropped": dropped} if exclude else None,
        }
        if skip_bad_records:
            manifest["skipped_records"] = len(skipped)
        with create_new(work / MANIFEST, "w") as f:  # last: a directory without it is not a datastore
            f.write(json.dumps(manifest, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        fsync_directory(work)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(work, 0o777 & ~umask)  # mkdtemp makes it 0700; a datastore is shared by workers

        _check_out_dir(out, force)  # again: something may have appeared there meanwhile
        _move_into_place(work, out)
        fsync_directory(out.parent)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    finally:
        os.close(lock)
    seconds = time.perf_counter() - started
    if exclude:
        log(f"dropped {dropped:,} documents sharing a run of {EXCLUDE_NGRAM} words with {', '.join(map(str, exclude))}")
    if skipped:
        warn(f"skipped {len(skipped):,} bad record(s)" + (f"; the first {_SHOWN_BAD_RECORDS} are named above"
                                                         if len(skipped) > _SHOWN_BAD_RECORDS else ""))
    log(
        f"built {out}: {documents:,} documents, {manifest['total_tokens']:,} tokens in {len(writer.entries)} "
        f"shard(s), {seconds:.1f}s ({manifest['total_tokens'] / max(seconds, 1e-9):,.0f} tokens/s; "
        f"suffix arrays {writer.sort_seconds:.1f}s)"
    )
    return manifest
