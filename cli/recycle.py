"""``freespec recycle``: merge and inspect token-recycling matrix files (docs/recycle.md).

    freespec recycle merge A.npz B.npz [...] -o OUT.npz
    freespec recycle info FILE.npz

``merge`` combines the matrices several replicas saved (``matrix_path``) into one file that
replicas merge back in (``merge_from``): for every token, the newest row wins. Every input must
come from the same tokenizer, vocabulary size and candidate count (the first input's); a
mismatch names the field. Memory: two matrices at a time (the result and one input), e.g.
2 x 2.6 MB for SmolLM2, 2 x 7.9 MB for Qwen2.5, however many inputs. ``OUT`` is written
atomically, so a replica never reads half a file; it may be one of the inputs.
Exit code 2: an input is missing, corrupt or of another vocabulary.
"""
from __future__ import annotations

import json
import os
import sys

from freespec.proposers.recycle.matrix import MatrixFileError, merge_files, read_matrix
from freespec.safe_files import printable


def _error(message: str) -> int:
    print(f"freespec: error: {printable(message)}", file=sys.stderr, flush=True)
    return 2


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("recycle", help="merge and inspect token-recycling matrix files",
                              description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="recycle_command", required=True)
    merge = sub.add_parser("merge", help="merge matrix files of several replicas (newest row wins)")
    merge.add_argument("inputs", nargs="+", metavar="FILE", help="matrix files (.npz) saved by recycle servers")
    merge.add_argument("-o", "--out", required=True, metavar="OUT", help="merged matrix file to write")
    merge.set_defaults(func=run_merge)
    info = sub.add_parser("info", help="print a matrix file's metadata as JSON")
    info.add_argument("file", metavar="FILE")
    info.set_defaults(func=run_info)


def run_merge(args) -> int:
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        return _error(f"--out {args.out!r}: directory {out_dir!r} does not exist")
    try:
        result, taken = merge_files(list(args.inputs), args.out)
    except (MatrixFileError, FileNotFoundError) as e:
        return _error(str(e))
    except OSError as e:  # the inputs were read and checked: writing --out failed (full disk, read-only)
        return _error(f"--out {args.out!r}: could not write the merged matrix ({e.strerror or e}); "
                      "the file there, if any, is unchanged")
    for path, n in zip(args.inputs, taken):
        print(f"freespec: {printable(path)}: {n} rows taken", file=sys.stderr)
    known = int((result.ids[:, 0] >= 0).sum())
    print(f"freespec: {printable(args.out)}: {known} of {result.vocab_size} tokens known", file=sys.stderr)
    print(args.out)
    return 0


def run_info(args) -> int:
    try:
        m = read_matrix(args.file, "matrix file")
    except (MatrixFileError, FileNotFoundError) as e:
        return _error(str(e))
    known = m.ids[:, 0] >= 0
    info = {k: v for k, v in m.meta.items() if k != "sha256"}
    info.update(
        known_tokens=int(known.sum()),
        newest_row=int(m.stamps.max()) if m.stamps.size else 0,
        bytes_in_memory=m.nbytes(),
    )
    print(json.dumps(info, indent=2))  # JSON escapes every control character (ensure_ascii)
    return 0
