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
shard's suffix array (binary search: O(log n) per shard). Files are opened with
``numpy.memmap`` read-only, so several workers on one host share one copy through the page
cache and none holds the datastore in its own memory.

Opening checks the format version, the tokenizer fingerprint and each file's size against
the manifest (a truncated shard fails at start); ``verify`` also recomputes the checksums
and spot-checks that each suffix array is sorted.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FORMAT = "freespec-datastore"
VERSION = 1
SEPARATOR = np.uint32(2**32 - 1)
MANIFEST = "manifest.json"


class DatastoreError(ValueError):
    """A datastore that must not be used; the message names the directory, the file and the reason."""


@dataclass
class Shard:
    name: str
    tokens: np.ndarray  # uint32 memmap [n]
    sa: np.ndarray  # uint32 memmap [n]


def file_sha256(path: Path, chunk: int = 1 << 24, progress=None) -> str:
    """sha256 of a file, read in chunks; ``progress`` (a tqdm bar, optional) is advanced by the bytes read."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
            if progress is not None:
                progress.update(len(block))
    return h.hexdigest()


def read_manifest(directory: str | os.PathLike) -> dict:
    path = Path(directory) / MANIFEST
    if not path.exists():
        raise DatastoreError(f"retrieval datastore {str(directory)!r}: no {MANIFEST} (not a datastore, or not built yet)")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DatastoreError(f"retrieval datastore {str(directory)!r}: unreadable {MANIFEST} ({e})") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DatastoreError(f"retrieval datastore {str(directory)!r}: {MANIFEST} is not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise DatastoreError(
            f"retrieval datastore {str(directory)!r}: format version {manifest.get('version')!r}, "
            f"this freespec reads version {VERSION}; rebuild it with `freespec datastore build`"
        )
    return manifest


class Datastore:
    """An opened datastore: read-only memory maps of every shard."""

    def __init__(self, directory: str | os.PathLike, manifest: dict, shards: list[Shard]) -> None:
        self.directory = Path(directory)
        self.manifest = manifest
        self.shards = shards

    @property
    def total_tokens(self) -> int:
        return int(self.manifest["total_tokens"])

    @classmethod
    def open(cls, directory: str | os.PathLike, tokenizer_fingerprint: str | None = None) -> "Datastore":
        """Map every shard; refuse another tokenizer, another format version or a truncated file."""
        directory = Path(directory)
        manifest = read_manifest(directory)
        theirs = (manifest.get("tokenizer") or {}).get("fingerprint")
        if tokenizer_fingerprint is not None and theirs != tokenizer_fingerprint:
            name = (manifest.get("tokenizer") or {}).get("name")
            raise DatastoreError(
                f"retrieval datastore {str(directory)!r} was built with another tokenizer ({name!r}, {theirs}); "
                f"this model's tokenizer is {tokenizer_fingerprint}. Rebuild it with "
                "`freespec datastore build --tokenizer MODEL_DIR ...`"
            )
        if manifest.get("separator", int(SEPARATOR)) != int(SEPARATOR):
            raise DatastoreError(
                f"retrieval datastore {str(directory)!r}: separator {manifest.get('separator')!r}, "
                f"this freespec uses {int(SEPARATOR)}"
            )
        entries = manifest.get("shards")
        if not isinstance(entries, list):
            raise DatastoreError(f"retrieval datastore {str(directory)!r}: {MANIFEST} has no shard list")
        shards = []
        for entry in entries:
            try:
                n = int(entry["tokens"])
                str(entry["name"])
            except (KeyError, TypeError, ValueError):
                raise DatastoreError(
                    f"retrieval datastore {str(directory)!r}: malformed shard entry in {MANIFEST}: {entry!r}"
                ) from None
            arrays = []
            for suffix in ("tokens", "sa"):
                path = directory / f"{entry['name']}.{suffix}"
                if not path.exists():
                    raise DatastoreError(f"retrieval datastore {str(directory)!r}: missing file {path.name}")
                size = path.stat().st_size
                if size != 4 * n:
                    raise DatastoreError(
                        f"retrieval datastore {str(directory)!r}: {path.name} has {size} bytes, the manifest "
                        f"says {4 * n} ({n} tokens): truncated or from another build"
                    )
                arrays.append(np.memmap(path, dtype="<u4", mode="r", shape=(n,)) if n else np.zeros(0, "<u4"))
            shards.append(Shard(entry["name"], arrays[0], arrays[1]))
        return cls(directory, manifest, shards)

    def read_ahead(self) -> None:
        """Ask the kernel to read every shard file into the page cache, in the background.

        A lookup is a binary search touching ~log2(n) pages scattered over the suffix array: on pages
        not yet in memory each one is a disk read, which slows the first steps of a server (or every step,
        after memory pressure pushed the files out) far more than the search itself. The advice does not
        block and takes no memory of its own: the pages are the shared page cache that every worker on
        the host maps.
        """
        if not hasattr(os, "posix_fadvise"):
            return
        for entry in self.manifest["shards"]:
            for suffix in ("tokens", "sa"):
                fd = os.open(self.directory / f"{entry['name']}.{suffix}", os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
                finally:
                    os.close(fd)

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
