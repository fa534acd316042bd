"""What the state directory's log tests share: a peer's segment written by hand."""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
from freespec import confined
from freespec.proposers.learned.folder_log import EXT, SUM_BYTES, encode_record, segment_header

FP = "sha256:tok-a"


def plant(path: Path, responses: list[list[int]], fingerprint: str = FP, stamp_ns: int | None = None) -> Path:
    """A peer's segment in ``folder_log``'s format, written by hand: its writer from its name, its scope from its
    folder (``suffix/``: the shared one); mode 0600, new (never over a file)."""
    scope = "" if path.parent.name == "suffix" else path.parent.name
    writer = path.name[: -len(EXT)].rsplit(".", 1)[0]
    header = segment_header(fingerprint, 1000, writer, scope)
    stamp = time.time_ns() if stamp_ns is None else stamp_ns
    data = header + b"".join(encode_record(header[-SUM_BYTES:], np.array(r, dtype=np.int32), stamp + i)
                             for i, r in enumerate(responses))
    confined.makedirs(str(path.parent))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(fd, "wb") as f:
        f.write(data)
    return path
