"""``freespec state``: what the learned sources keep in a state directory (option ``state_dir``), and removing it.

``freespec state list DIR`` lists every file by source, with its age and size; ``freespec state purge DIR``
removes them all, or those older than ``--older-than DAYS``, or one writer's (``--writer NAME``, as listed), or
one tenant's learning (``--scope SALT``: its files, and a tombstone every replica acts on at its next save).

Every argument is checked before anything is removed: ``DAYS`` a finite number, 0 or more; ``NAME`` a writer's
name (``HOST.PIDNS.PID``, as ``state_dir.writer_id`` makes it); ``SALT`` not empty; ``DIR`` an existing folder.
A bad one is refused naming it (argparse's exit status 2, or 1 for ``DIR``), with nothing removed. Every name
printed (files, scopes) goes through ``printable``: no control or bidi character reaches the terminal, and each
entry is one line.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import time

from freespec.proposers.learned import state_dir, state_purge
from freespec.proposers.learned import is_url
from freespec.safe_files import printable

# A writer's name as ``state_dir.writer_id`` makes it: the host name (``[A-Za-z0-9_.-]``, at most 64 characters,
# not starting with a dot, no ``..``), the PID namespace and the pid (ASCII digits).
_WRITER = re.compile(r"(?!.*\.\.)[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}\.[0-9]{1,20}\.[0-9]{1,20}")


def days(value: str) -> float:
    """``--older-than``: a finite number of days, 0 or more (``nan``, ``inf`` and negatives are refused: each
    would remove every file, fresh tombstones included)."""
    try:
        n = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of days: {printable(repr(value))}") from None
    if not math.isfinite(n * 86_400.0) or n < 0:  # in seconds too (1e305 days is not)
        raise argparse.ArgumentTypeError(f"must be a finite number of days, 0 or more, not {printable(value)}")
    return n + 0.0  # -0.0 as 0.0


def writer_name(value: str) -> str:
    """``--writer``: a writer's name as ``freespec state list`` shows it (``HOST.PIDNS.PID``)."""
    if not _WRITER.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"not a writer's name: {printable(repr(value))} (HOST.PIDNS.PID as `freespec state list` shows it, "
            "e.g. node-1.4026531836.4242; the host of letters, digits and _.-)")
    return value


def salt(value: str) -> str:
    """``--scope``: the tenant's ``cache_salt``, not empty (an empty one would name the shared scope)."""
    if not value:
        raise argparse.ArgumentTypeError("needs the tenant's cache_salt, not an empty string")
    return value


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("state", help="list or remove what learned sources keep in a state directory")
    sub = p.add_subparsers(dest="state_command", required=True)
    ls = sub.add_parser("list", help="every file, by source, with its age and size")
    ls.add_argument("dir", metavar="DIR",
                    help="the state directory (the state_dir option, freespec serve --state-dir), or its Redis URL")
    ls.set_defaults(func=run_list)
    rm = sub.add_parser("purge", help="remove files: all of them, or by age or writer")
    rm.add_argument("dir", metavar="DIR", help="the state directory")
    rm.add_argument("--older-than", type=days, metavar="DAYS",
                    help="only files not written for DAYS days (a finite number, 0 or more)")
    rm.add_argument("--writer", type=writer_name, metavar="NAME",
                    help="only this writer's files (HOST.PIDNS.PID, as listed)")
    rm.add_argument("--scope", type=salt, metavar="SALT",
                    help="only the learning of requests with this cache_salt, from disk now and from every "
                         "running replica at its next save (not with --older-than or --writer)")
    rm.set_defaults(func=run_purge)


def _checked(folder: str) -> str:
    """``folder`` if it is an existing directory (or a Redis URL, ``proposers.learned``, checked); ``ValueError``
    naming DIR otherwise (never a URL's password)."""
    if is_url(folder):
        from freespec.proposers.learned.redis_stream import check_url

        return check_url(folder)
    try:
        is_dir = os.path.isdir(folder)
        exists = is_dir or os.path.lexists(folder)
    except (OSError, ValueError):  # a NUL byte, a name too long
        is_dir = exists = False
    if not is_dir:
        what = "it is not a directory" if exists else "it does not exist"
        raise ValueError(f"freespec state: DIR {printable(repr(folder))} is not a folder ({what})")
    return folder


def _name(path: str, folder: str) -> str:
    """A file's name under ``folder`` as printed: one line, control and bidi characters escaped."""
    return printable(os.path.relpath(path, folder))


def _on_redis(url: str, work, *args, **kwargs):
    """``work(url, ...)`` with a Redis failure as a ``ValueError`` naming the server (never its password)."""
    import redis

    from freespec.proposers.learned.redis_stream import redacted

    try:
        return work(url, *args, **kwargs)
    except redis.RedisError as e:
        raise ValueError(f"freespec state: Redis {redacted(url)}: {type(e).__name__}: {e}") from None


def run_list(args) -> int:
    now = time.time()
    folder = _checked(args.dir)
    if is_url(folder):
        from freespec.proposers.learned.redis_stream import list_state

        streams = _on_redis(folder, list_state)
        for s in streams:
            rows = "" if s.rows is None else f"\t{s.rows} rows"  # recycle's snapshot
            print(f"{printable(s.name)}\t{s.newest_age_s / 86_400:.1f} days\t{s.records} records{rows}\t{s.bytes} bytes")
        print(f"{len(streams)} stream(s), {sum(s.records for s in streams)} records, {sum(s.bytes for s in streams)} "
              "bytes")
        return 0
    files = state_dir.state_files(folder)
    for path, mtime, size in files:
        print(f"{_name(path, folder)}\t{(now - mtime) / 86_400:.1f} days\t{size} bytes")
    print(f"{len(files)} file(s), {sum(f[2] for f in files)} bytes")
    return 0


def run_purge(args) -> int:
    # Every check before the first removal (argparse's types check the values; these, what they cannot).
    folder = _checked(args.dir)
    older = getattr(args, "older_than", None)
    writer = getattr(args, "writer", None)
    if older is not None and (not math.isfinite(older * 86_400.0) or older < 0):
        raise ValueError(f"freespec state: --older-than must be a finite number of days, 0 or more, "
                         f"not {printable(older)}")
    if writer is not None and not _WRITER.fullmatch(writer):
        raise ValueError(f"freespec state: --writer {printable(repr(writer))} is not a writer's name "
                         "(HOST.PIDNS.PID)")
    if args.scope is not None:
        if not args.scope:
            raise ValueError("freespec state: --scope needs the tenant's cache_salt")
        if older is not None or writer is not None:
            raise ValueError("freespec state: --scope removes all of a tenant's learning: not with --older-than "
                             "or --writer")
        from freespec.proposers.learned.scoped_responses import purge_scope
        from freespec.vllm_plugins.request_ids import scope_of

        if is_url(folder):
            from freespec.proposers.learned import redis_stream

            n = _on_redis(folder, redis_stream.purge_scope, scope_of(args.scope))
            print(f"{n} record(s) removed; running replicas forget the scope within a second")
            return 0
        gone = purge_scope(os.path.join(folder, "suffix"), scope_of(args.scope))
        print(f"{len(gone)} file(s) removed; running replicas forget the scope at their next save")
        return 0
    if is_url(folder):
        from freespec.proposers.learned import redis_stream

        n = _on_redis(folder, redis_stream.purge, older_than_s=None if older is None else older * 86_400.0, writer=writer)
        print(f"{n} record(s) removed; running replicas drop them within a second")
        return 0
    gone = state_purge.purge(folder, older_than_s=None if older is None else older * 86_400.0, writer=writer)
    for path in gone:
        print(f"removed {_name(path, folder)}")
    print(f"{len(gone)} file(s) removed")
    return 0
