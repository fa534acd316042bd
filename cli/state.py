"""``freespec state``: what the learned sources keep in a state directory (option ``state_dir``), and removing it.

``freespec state list DIR`` lists every file by source, with its age and size; ``freespec state purge DIR``
removes them all, or those older than ``--older-than DAYS``, or one writer's (``--writer NAME``, as listed), or
one tenant's learning (``--scope SALT``: its files, and a tombstone every replica acts on at its next save).
"""
from __future__ import annotations

import os
import time

from freespec.proposers import state_dir


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("state", help="list or remove what learned sources keep in a state directory")
    sub = p.add_subparsers(dest="state_command", required=True)
    ls = sub.add_parser("list", help="every file, by source, with its age and size")
    ls.add_argument("dir", help="the state directory (the state_dir option, freespec serve --state-dir)")
    ls.set_defaults(func=run_list)
    rm = sub.add_parser("purge", help="remove files: all of them, or by age or writer")
    rm.add_argument("dir", help="the state directory")
    rm.add_argument("--older-than", type=float, metavar="DAYS", help="only files not written for DAYS days")
    rm.add_argument("--writer", help="only this writer's files (HOST.PIDNS.PID, as listed)")
    rm.add_argument("--scope", metavar="SALT", help="only the learning of requests with this cache_salt, from disk "
                    "now and from every running replica at its next save")
    rm.set_defaults(func=run_purge)


def _checked(folder: str) -> str:
    if not os.path.isdir(folder):
        raise ValueError(f"freespec state: {folder!r} is not a folder")
    return folder


def run_list(args) -> int:
    now = time.time()
    files = state_dir.state_files(_checked(args.dir))
    for path, mtime, size in files:
        print(f"{os.path.relpath(path, args.dir)}\t{(now - mtime) / 86_400:.1f} days\t{size} bytes")
    print(f"{len(files)} file(s), {sum(f[2] for f in files)} bytes")
    return 0


def run_purge(args) -> int:
    if args.scope is not None:
        from freespec.proposers.scoped_responses import purge_scope
        from freespec.vllm_plugins.request_ids import scope_of

        if not args.scope:
            raise ValueError("freespec state: --scope needs the tenant's cache_salt")
        gone = purge_scope(os.path.join(_checked(args.dir), "suffix"), scope_of(args.scope))
        print(f"{len(gone)} file(s) removed; running replicas forget the scope at their next save")
        return 0
    older = None if args.older_than is None else args.older_than * 86_400.0
    gone = state_dir.purge(_checked(args.dir), older_than_s=older, writer=args.writer)
    for path in gone:
        print(f"removed {os.path.relpath(path, args.dir)}")
    print(f"{len(gone)} file(s) removed")
    return 0
