"""``freespec state purge``'s work on a state directory: choose the files, record what they held
(``proposers.learned.purges``), remove them. A library function: the command only checks its arguments and prints.
"""
from __future__ import annotations

import logging
import os
import time

import numpy as np
from freespec import confined
from freespec.proposers.learned.folder_log import read_segment, segment_name
from freespec.proposers.learned.purges import digests_of, write_record
from freespec.proposers.recycle.matrix import MatrixFileError, read_matrix
from freespec.proposers.learned.response_store import MAX_TOKENS, ResponseStoreError, _digest, read_any
from freespec.proposers.learned.state_dir import age, is_tombstone, state_files

logger = logging.getLogger("freespec")

MAX_VOCAB = 1 << 31  # a segment's ids are checked against its own tokenizer by the replicas; here only read
MAX_SEGMENT_BYTES = 4 * MAX_TOKENS + (64 << 20)  # a writer's segment: twice its bounds at most (folder_log)


def purge(folder: str, *, older_than_s: float | None = None, writer: str | None = None,
          now: float | None = None) -> list[str]:
    """Remove files of ``state_dir`` (every one, or those older than ``older_than_s``, or ``writer``'s own) and
    record first what they held (``proposers.learned.purges``), so that no replica keeps, writes back or merges it
    again: by writer, the digests of its files' responses; by age or in whole, every response stamped before
    the cutoff. Returns the removed paths. A writer's file whose content cannot be read is removed all the same
    (logged: what replicas merged of it stays)."""
    now = time.time() if now is None else now
    cutoff = now - (older_than_s or 0.0)
    chosen = []
    for path, mtime, _ in state_files(folder):
        name = os.path.basename(path)
        if is_tombstone(path):
            continue  # a scope's tombstone goes only when its scope holds no file (``scoped_responses``)
        if older_than_s is not None and age(mtime, now) <= older_than_s:
            continue
        if writer is not None and _writer_of(name) != writer and f"-{writer}." not in name:
            continue
        chosen.append(path)
    if writer is not None:
        digests, recycle_before = _contents(chosen)
        if len(digests) or recycle_before:
            write_record(folder, digests=digests, before_ns=int(cutoff * 1e9), recycle_before=recycle_before)
    elif chosen:
        write_record(folder, before_ns=int(cutoff * 1e9), recycle_before=int(cutoff))
    gone = []
    for path in chosen:
        try:
            if confined.unlink(path):
                gone.append(path)
        except OSError:
            continue
    return gone


def _writer_of(name: str) -> str:
    """The writer of a file: ``<writer>.<ext>`` (snapshots, matrices) or ``<writer>.<seq>.log`` (log segments)."""
    segment = segment_name(name)
    return segment[0] if segment is not None else name.rsplit(".", 1)[0]


def _contents(paths: list[str]):
    """What the files ``paths`` hold, as a purge by writer records it: their responses' digests and their newest
    recycle row stamp."""
    digests, recycle_before = [], 0
    for path in paths:
        name = os.path.basename(path)
        if name.startswith("."):
            continue  # a temporary: never read by any replica
        try:
            if name.endswith(".bin"):
                digests.append(digests_of([e.digest for e in read_any(path).entries]))
            elif segment_name(name) is not None:  # a log segment: its records' digests, whatever its tokenizer
                _, _, records = read_segment(path, vocab_size=MAX_VOCAB, max_tokens=MAX_TOKENS, limit=MAX_SEGMENT_BYTES)
                digests.append(digests_of([_digest(tokens) for tokens, _ in records]))
            elif name.endswith(".npz"):
                stamps = read_matrix(path).stamps
                recycle_before = max(recycle_before, int(stamps.max()) if len(stamps) else 0)
        except (OSError, ResponseStoreError, MatrixFileError, ValueError) as e:
            logger.warning("freespec state purge: %s removed unread (%s): what replicas merged of it stays",
                           path, e)
    return (np.concatenate(digests) if digests else np.zeros(0, dtype="<u8")), recycle_before
