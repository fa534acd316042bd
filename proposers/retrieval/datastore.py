"""The retrieval datastore on disk: token shards with suffix arrays, memory-mapped, never unpickled.

A datastore is a directory:

- ``manifest.json``: ``format`` ("freespec-datastore"), ``version`` (1), ``tokenizer``
  (``{"name", "fingerprint"}``, the fingerprint from ``freespec.proposers.vocab``),
  ``vocab_size``, ``separator`` (the token id written between documents, 2**32 - 1:
  never a real token, so no match and no continuation crosses a document boundary),
  ``shards`` (list, see below), ``total_tokens``, ``documents``, ``created``
  (ISO time), and, informational: ``sources`` (the input paths), ``roles`` (the chat roles
  kept, or null) and ``excluded`` (``{"files", "ngram_words", "documents_dropped"}`` when
  documents overlapping evaluation data were dropped, else null);
- per shard ``NAME.tokens``: little-endian uint32 token ids (documents separated by
  ``separator``) and ``NAME.sa``: little-endian uint32 suffix array of that shard (the
  start positions of its suffixes in lexicographic order; a shard holds fewer than
  2**32 tokens). Each shard entry: ``{"name", "tokens", "tokens_sha256", "sa_sha256"}``.

Shards let a corpus larger than RAM be built one shard at a time; a query searches each
shard's suffix array (binary search: O(log n) per shard).

How a served datastore is held (``Datastore.open``'s ``in_memory_bytes``; the ``retrieval``
option ``in_memory_mb``, docs/reliability.md):

- up to that many bytes of shard files (8 bytes per token: tokens and suffix array) are
  **read into the process's private memory**. A file changed in place afterwards (``cp`` over
  it, ``rsync --inplace``, a shared filesystem rewriting it) cannot hurt the process: it keeps
  the text it read. Cost: the files' size in each drafting process.
- larger datastores are opened with ``numpy.memmap`` read-only, so several workers on one host
  share one copy through the page cache and none holds the datastore in its own memory. A
  mapped file that is *truncated* in place kills the process with SIGBUS at the next access,
  which no check can prevent (the file may shrink between a check and the access). The adapter
  narrows it: every step ``check_files`` compares each held file's size (``fstat`` of the
  descriptor kept open) with the manifest and drops a shard that changed before it is read. The
  remedy is the operator's: replace a served datastore only by rename (``freespec datastore
  build --force`` builds a new directory and swaps it in; a renamed-over file keeps its old
  inode whole for the processes that map it).

Opening checks the format version, the tokenizer fingerprint, every manifest field's type,
that shard names are plain file names inside the directory, and each file's size against
the manifest (a truncated shard fails at start); ``verify`` also recomputes the checksums
and spot-checks that each suffix array is sorted.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from freespec.safe_files import clip, load_json, open_regular, open_regular_fd, short

FORMAT = "freespec-datastore"
VERSION = 1
SEPARATOR = np.uint32(2**32 - 1)
MANIFEST = "manifest.json"
# A manifest lists its shards (a few hundred bytes each): 64 MiB is far beyond any real one, and it is flat
# JSON (depth 3: the manifest, its shard list, a shard).
MAX_MANIFEST_BYTES = 64 << 20
MAX_MANIFEST_DEPTH = 16


class DatastoreError(ValueError):
    """A datastore that must not be used; the message names the directory, the file and the reason."""


@dataclass
class Shard:
    name: str
    tokens: np.ndarray  # uint32 [n]: a read-only memmap, or a private read-only array
    sa: np.ndarray  # uint32 [n]
    # Mapped shards only: open descriptors of the two files and the size each must keep (``check_files``).
    fds: tuple[int, ...] = ()
    nbytes: int = 0


def file_sha256(path: Path, chunk: int = 1 << 24, progress=None) -> str:
    """sha256 of a file, read in chunks; ``progress`` (a tqdm bar, optional) is advanced by the bytes read."""
    h = hashlib.sha256()
    with open_regular(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
            if progress is not None:
                progress.update(len(block))
    return h.hexdigest()


def read_manifest(directory: str | os.PathLike) -> dict:
    """The manifest of ``directory``, with every field a served datastore relies on checked (errors name it)."""
    path = Path(directory) / MANIFEST
    if not path.exists():
        raise DatastoreError(f"retrieval datastore {str(directory)!r}: no {MANIFEST} (not a datastore, or not built yet)")
    try:
        manifest = load_json(path, max_bytes=MAX_MANIFEST_BYTES, max_depth=MAX_MANIFEST_DEPTH, what=MANIFEST)
    except (OSError, ValueError) as e:
        raise DatastoreError(f"retrieval datastore {str(directory)!r}: unreadable {MANIFEST} "
                             f"({type(e).__name__}: {clip(str(e))})") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DatastoreError(f"retrieval datastore {str(directory)!r}: {MANIFEST} is not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise DatastoreError(
            f"retrieval datastore {str(directory)!r}: format version {short(manifest.get('version'))}, "
            f"this freespec reads version {VERSION}; rebuild it with `freespec datastore build`"
        )
    _check_fields(str(directory), manifest)
    return manifest


def _check_fields(directory: str, manifest: dict) -> None:
    """Refuse a manifest field of the wrong type, and shard names that would open files outside ``directory``."""

    def refuse(field: str, why: str) -> DatastoreError:
        return DatastoreError(f"retrieval datastore {directory!r}: {MANIFEST} field {field!r} {why}")

    tokenizer = manifest.get("tokenizer")
    if not isinstance(tokenizer, dict):
        raise refuse("tokenizer", f'must be an object {{"name": ..., "fingerprint": ...}}, got {short(tokenizer)}')
    for key in ("name", "fingerprint"):
        if not isinstance(tokenizer.get(key), (str, type(None))):
            raise refuse(f"tokenizer.{key}", f"must be a string, got {short(tokenizer.get(key))}")
    entries = manifest.get("shards")
    if not isinstance(entries, list):
        raise refuse("shards", f"must be a list of shard entries, got {type(entries).__name__}")
    seen = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise refuse(f"shards[{i}]", f"must be an object {{\"name\", \"tokens\", ...}}, got {short(entry)}")
        name, n = entry.get("name"), entry.get("tokens")
        if not isinstance(name, str) or not _plain_file_name(name):
            raise refuse(f"shards[{i}].name", f"is {short(name)}: a shard name must be a file name inside the "
                         "datastore directory (not empty, not absolute, no '/', no '..')")
        if name in seen:
            raise refuse(f"shards[{i}].name", f"names shard {short(name)} twice")
        seen.add(name)
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < 2**32:
            raise refuse(f"shards[{i}].tokens", f"must be a token count in [0, 2**32), got {short(n)}")
        for key in ("tokens_sha256", "sa_sha256"):
            if not isinstance(entry.get(key, ""), str):
                raise refuse(f"shards[{i}].{key}", f"must be a hex string, got {short(entry.get(key))}")
    total = manifest.get("total_tokens")
    if not _is_count(total) or total != sum(e["tokens"] for e in entries):
        raise refuse("total_tokens", f"must be the shards' token count ({sum(e['tokens'] for e in entries)}), "
                     f"got {short(total)}")
    for key in ("vocab_size", "documents", "separator"):
        if key in manifest and not _is_count(manifest[key]):
            raise refuse(key, f"must be a non-negative integer, got {short(manifest[key])}")


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _plain_file_name(name: str) -> bool:
    return (
        name not in ("", ".", "..") and "\0" not in name and "/" not in name
        and (os.altsep is None or os.altsep not in name) and not os.path.isabs(name)
    )


class Datastore:
    """An opened datastore: every shard read into private memory, or mapped read-only (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike, manifest: dict, shards: list[Shard], in_memory: bool = False) -> None:
        self.directory = Path(directory)
        self.manifest = manifest
        self.shards = shards
        self.in_memory = in_memory
        self.dropped: list[str] = []  # mapped shards dropped because their file changed in place

    @property
    def total_tokens(self) -> int:
        return int(self.manifest["total_tokens"])

    @classmethod
    def open(
        cls, directory: str | os.PathLike, tokenizer_fingerprint: str | None = None, in_memory_bytes: int = 0
    ) -> "Datastore":
        """Open every shard; refuse another tokenizer, another format version, a bad field or a truncated file.

        Shard files totalling at most ``in_memory_bytes`` are read into private memory (safe from files
        changed in place); larger datastores are memory-mapped (shared page cache; replace only by rename).
        A datastore swapped for a rebuilt one while it was opened (``build --force``) is opened again, so the
        manifest and the shards always come from one build.
        """
        directory = Path(directory)
        for attempt in range(3):
            before = _identity(directory)
            try:
                store = cls._open_once(directory, tokenizer_fingerprint, in_memory_bytes)
            except DatastoreError:
                if attempt < 2 and _identity(directory) != before:
                    continue
                raise
            if attempt == 2 or _identity(directory) == before:
                return store
            store.close()
        raise AssertionError("unreachable")  # pragma: no cover

    @classmethod
    def _open_once(cls, directory: Path, tokenizer_fingerprint: str | None, in_memory_bytes: int) -> "Datastore":
        manifest = read_manifest(directory)
        theirs = manifest["tokenizer"].get("fingerprint")
        if tokenizer_fingerprint is not None and theirs != tokenizer_fingerprint:
            name = manifest["tokenizer"].get("name")
            raise DatastoreError(
                f"retrieval datastore {str(directory)!r} was built with another tokenizer ({short(name)}, {short(theirs)}); "
                f"this model's tokenizer is {tokenizer_fingerprint}. Rebuild it with "
                "`freespec datastore build --tokenizer MODEL_DIR ...`"
            )
        if manifest.get("separator", int(SEPARATOR)) != int(SEPARATOR):
            raise DatastoreError(
                f"retrieval datastore {str(directory)!r}: separator {short(manifest.get('separator'))}, "
                f"this freespec uses {int(SEPARATOR)}"
            )
        entries = manifest["shards"]
        in_memory = sum(8 * entry["tokens"] for entry in entries) <= in_memory_bytes
        shards: list[Shard] = []
        try:
            for entry in entries:
                shards.append(_open_shard(directory, entry["name"], entry["tokens"], in_memory))
        except BaseException:
            for shard in shards:
                _close_fds(shard)
            raise
        return cls(directory, manifest, shards, in_memory)

    def mapped_shards(self) -> list[str]:
        """Names of the shards served from memory maps (empty when the datastore was read into memory)."""
        return [shard.name for shard in self.shards if shard.fds]

    def check_files(self) -> list[str]:
        """Drop every mapped shard whose file changed size in place; returns the names dropped now.

        Cheap (one ``fstat`` per mapped file), so it runs every step before any shard is read. It narrows the
        window in which a file truncated in place kills the process, it cannot close it; replacing files by
        rename is safe (the mapped inode stays whole).
        """
        dropped = []
        for shard in self.shards:
            if not shard.fds:
                continue
            try:
                changed = any(os.fstat(fd).st_size != shard.nbytes for fd in shard.fds)
            except OSError:
                changed = True
            if changed:
                _close_fds(shard)
                shard.tokens = shard.sa = np.zeros(0, "<u4")
                dropped.append(shard.name)
        self.dropped += dropped
        return dropped

    def close(self) -> None:
        """Release the descriptors held for ``check_files`` (the maps go with the arrays)."""
        for shard in self.shards:
            _close_fds(shard)

    def read_ahead(self) -> None:
        """Ask the kernel to read every shard file into the page cache, in the background.

        A lookup is a binary search touching ~log2(n) pages scattered over the suffix array: on pages
        not yet in memory each one is a disk read, which slows the first steps of a server (or every step,
        after memory pressure pushed the files out) far more than the search itself. The advice does not
        block and takes no memory of its own: the pages are the shared page cache that every worker on
        the host maps. A datastore read into memory needs none.
        """
        if not hasattr(os, "posix_fadvise"):
            return
        for shard in self.shards:
            for fd in shard.fds:
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
                except OSError:
                    pass

    def verify(self, samples: int = 10_000, progress=None) -> list[str]:
        """Problems found (empty: fine): checksums of every file and sortedness of sampled suffix-array neighbours."""
        problems = []
        for entry, shard in zip(self.manifest["shards"], self.shards):
            for suffix, key in (("tokens", "tokens_sha256"), ("sa", "sa_sha256")):
                path = self.directory / f"{entry['name']}.{suffix}"
                if file_sha256(path, progress=progress) != entry.get(key):
                    problems.append(f"{path.name}: checksum mismatch (modified or corrupt)")
            problems += _check_sorted(shard, samples)
        return problems


def _identity(directory: Path) -> tuple[int, int] | None:
    """(device, inode) of the directory the path names now; a rebuild swapped in changes it."""
    try:
        st = os.stat(directory)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _open_shard(directory: Path, name: str, n: int, in_memory: bool) -> Shard:
    """One shard's two files, checked against the manifest's size: read into memory, or mapped with their fds held."""
    arrays, fds = [], []
    try:
        for suffix in ("tokens", "sa"):
            path = directory / f"{name}.{suffix}"
            try:
                fd = open_regular_fd(path)  # a FIFO or device in a datastore is refused, never waited on
            except FileNotFoundError:
                raise DatastoreError(f"retrieval datastore {str(directory)!r}: missing file {path.name}") from None
            except OSError as e:
                raise DatastoreError(f"retrieval datastore {str(directory)!r}: cannot open {path.name} ({clip(str(e))})") from None
            fds.append(fd)
            size = os.fstat(fd).st_size
            if size != 4 * n:
                raise DatastoreError(
                    f"retrieval datastore {str(directory)!r}: {path.name} has {size} bytes, the manifest "
                    f"says {4 * n} ({n} tokens): truncated or from another build"
                )
            if n == 0:
                arrays.append(np.zeros(0, "<u4"))
            elif in_memory:
                arrays.append(_read_private(fd, n, directory, path.name))
            else:
                with os.fdopen(os.dup(fd), "rb") as f:  # the inode checked above, even if renamed over meanwhile
                    arrays.append(np.memmap(f, dtype="<u4", mode="r", shape=(n,)))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    if in_memory or n == 0:
        for fd in fds:
            os.close(fd)
        fds = []
    return Shard(name, arrays[0], arrays[1], tuple(fds), 4 * n)


def _read_private(fd: int, n: int, directory: Path, file_name: str) -> np.ndarray:
    """``n`` uint32 read from ``fd`` into a private read-only array; a file that shrank meanwhile is refused."""
    out = np.empty(n, dtype="<u4")
    view, done = memoryview(out).cast("B"), 0
    while done < 4 * n:
        got = os.preadv(fd, [view[done:]], done) if hasattr(os, "preadv") else _pread_into(fd, view, done)
        if got == 0:
            raise DatastoreError(f"retrieval datastore {str(directory)!r}: {file_name} shrank while it was read "
                                 f"({done} of {4 * n} bytes): changed in place")
        done += got
    out.flags.writeable = False
    return out


def _pread_into(fd: int, view: memoryview, offset: int) -> int:
    data = os.pread(fd, min(len(view) - offset, 1 << 26), offset)
    view[offset : offset + len(data)] = data
    return len(data)


def _close_fds(shard: Shard) -> None:
    for fd in shard.fds:
        try:
            os.close(fd)
        except OSError:
            pass
    shard.fds = ()


def _check_sorted(shard: Shard, samples: int, width: int = 64) -> list[str]:
    n = len(shard.sa)
    if n < 2:
        return []
    if n - 1 <= samples:  # small shard: every neighbouring pair
        positions = np.arange(n - 1)
    else:
        positions = np.random.default_rng(0).integers(0, n - 1, size=samples)
    for i in positions:
        a, b = int(shard.sa[i]), int(shard.sa[i + 1])
        if a >= n or b >= n:
            return [f"{shard.name}.sa: position out of range at {i}"]
        if a == b:
            return [f"{shard.name}.sa: position {a} twice (at {i} and {i + 1})"]
        x, y = shard.tokens[a : a + width], shard.tokens[b : b + width]
        m = min(len(x), len(y))
        diff = np.flatnonzero(x[:m] != y[:m])
        if len(diff):
            if x[diff[0]] > y[diff[0]]:
                return [f"{shard.name}.sa: not sorted at {i}"]
        elif len(x) > len(y) and m < width:
            return [f"{shard.name}.sa: not sorted at {i}"]
    return []


_SMAPS_FIELDS = ("Rss", "Pss", "Shared_Clean", "Shared_Dirty", "Private_Clean", "Private_Dirty")


def mapped_residency(directory: str | os.PathLike, pid: int | str = "self") -> dict | None:
    """How process ``pid`` holds the datastore's files in memory, in bytes, from ``/proc/PID/smaps``.

    Returns ``{"mappings", "shared_mappings", "Rss", "Pss", "Shared_Clean", ...}`` summed over the
    process's mappings of the datastore's files (``shared_mappings``: how many are MAP_SHARED), or
    None where there is no ``/proc`` (not Linux). A worker that maps the datastore as designed has
    only clean, shared pages of it: ``Private_Dirty`` 0, and ``Pss`` below ``Rss`` as soon as another
    process reads the same pages.
    """
    smaps = Path(f"/proc/{pid}/smaps")
    if not smaps.exists():
        return None
    root = str(Path(directory).resolve()) + os.sep
    totals = dict.fromkeys(("mappings", "shared_mappings", *_SMAPS_FIELDS), 0)
    inside = False
    for line in smaps.read_text().splitlines():
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and ":" not in head[0]:  # a mapping's header line
            inside = len(head) == 6 and head[5].startswith(root)
            if inside:
                totals["mappings"] += 1
                totals["shared_mappings"] += head[1].endswith("s")
        elif inside and head and head[0].rstrip(":") in _SMAPS_FIELDS:
            totals[head[0].rstrip(":")] += int(head[1]) * 1024  # smaps counts kB
    return totals
