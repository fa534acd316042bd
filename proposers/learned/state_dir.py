"""One state directory (option ``state_dir``) for every learned source of every replica and rank.

Layout: ``<state_dir>/<source>/…``: ``suffix/<writer>.<seq>.log``, this writer's append-only log segment of the
shared scope (a salted tenant's in ``suffix/<scope>/``; ``folder_log``), and ``recycle/<writer>.npz``, its matrix.
Each process writes only its own files and reads every other file of its source's folder (its peers: other
replicas and ranks, and its own earlier incarnations), at start and every ``save_every_s``: the suffix source
the bytes a peer appended since, recycle a peer's changed matrix, merged by a rule that is idempotent and
commutative, so nothing is counted twice however the files overlap.

The writer's name (``writer_id``) is the host name, the PID namespace (its inode, from ``/proc/self/ns/pid``) and
the pid: two live processes never share it, on one host or many sharing a folder, in containers or not, and a
container restarted with the same host name and pid takes its own file back. A temporary file carries the same
name, so a sweep removes only its own writer's leftovers (``own_temporaries``) and never another namespace's
whose pid merely looks dead here; other files go only by age (``sweep_old``). Files are created mode 0600: only
the serving user reads what other users were answered. Retention: a peer's file older than ``max_age_s`` is
neither merged nor kept (removed by the sweep); each file's size is bounded by its source's own options; and at
each writer's start, all writers' files together are cut to ``state_dir_max_mb``, oldest first (``cap_total``):
restarts make new writers, whose predecessors' files would otherwise stay until their age.
"""
from __future__ import annotations

import logging
import os
import re
import socket
import stat
import time

from freespec import confined

logger = logging.getLogger("freespec")

FILE_MODE = 0o600
SOURCES = ("suffix", "recycle")  # the folders of the sources that keep state here
DEFAULT_MAX_AGE_S = 30 * 86_400.0
KEEP_NEWER_THAN_S = 3_600.0  # cap_total leaves files written this recently: a live writer's
START_FILES = 64  # the newest peers' files a source reads at start; the others later, as they change (a log: from their end)
CLOCK_SLACK_S = 300.0  # a file dated further ahead of this clock than this is treated as expired (``age``)
CLOCK_SLACK_NS = int(CLOCK_SLACK_S * 10**9)  # the same, for stamps in nanoseconds
TOMBSTONES = "purged"  # suffix/purged/<scope> (scoped_responses), purged/*.purge (proposers.learned.purges)
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


_warned: set = set()


def legacy_warning(what: str) -> None:
    """One warning per process and option: the per-source paths still work; ``state_dir`` replaces them."""
    if what not in _warned:
        _warned.add(what)
        logger.warning("freespec: %s still work(s), but the option state_dir replaces them: one folder for every "
                       "source, replica and rank, files readable only by the serving user (docs/security.md)", what)


def writer_id() -> str:
    """This process's writer name: host, PID namespace and pid (see the module docstring)."""
    try:
        ns = os.readlink("/proc/self/ns/pid").partition("[")[2].rstrip("]") or "0"
    except OSError:
        ns = "0"
    host = _SAFE.sub("_", socket.gethostname())[:64] or "host"
    return f"{host}.{ns}.{os.getpid()}"


def open_root(state_dir: str, *, trust_others: bool = False) -> str:
    """At start: make ``state_dir`` this process's trust boundary (``freespec.confined``: created mode 0700 if
    missing, a warning if others can write it, no link below it ever followed); returns it. A Redis URL
    (``proposers.learned``) is no folder: returned as it is."""
    if state_dir.startswith(("redis://", "rediss://")):
        return state_dir
    confined.confine(state_dir, trust_others=trust_others)
    return state_dir


def source_dir(state_dir: str, source: str) -> str:
    """The folder of one source's files (made if missing, mode 0700; a link there is refused)."""
    path = os.path.join(state_dir, source)
    confined.makedirs(path)
    return path


def own_file(state_dir: str, source: str, ext: str) -> str:
    """This writer's file of ``source`` (the state directory made this process's boundary first)."""
    open_root(state_dir)
    return os.path.join(source_dir(state_dir, source), f"{writer_id()}.{ext}")


def age(mtime: float, now: float) -> float:
    """How old a file is. One dated more than ``CLOCK_SLACK_S`` ahead of this clock counts as infinitely old:
    neither merged nor kept (a clock gone wrong, or a planted date), so it never outlives the age bound."""
    return float("inf") if mtime - now > CLOCK_SLACK_S else now - mtime


def redated(path: str, st: os.stat_result, now: float) -> os.stat_result:
    """The ``lstat`` of a file that must outlive what it names (a tombstone, a purge record): one dated more than
    ``CLOCK_SLACK_S`` ahead of this clock is re-dated to ``now`` first, so that it ages from its first sight,
    never forever. ``OSError`` if it cannot be."""
    if st.st_mtime - now <= CLOCK_SLACK_S:
        return st
    confined.touch(path, now)
    return confined.lstat(path)


def peer_files(own: str, max_age_s: float = DEFAULT_MAX_AGE_S, now: float | None = None) -> list[str]:
    """The other writers' files beside ``own`` (same extension, regular files, not links), newer than
    ``max_age_s`` (``age``); oldest first."""
    directory, name = os.path.split(own)
    ext = name.rsplit(".", 1)[-1]
    now = time.time() if now is None else now
    found = []
    for entry, st in confined.entries(directory):
        if entry == name or entry.startswith(".") or not entry.endswith("." + ext):
            continue
        if stat.S_ISREG(st.st_mode) and age(st.st_mtime, now) <= max_age_s:
            found.append((st.st_mtime, os.path.join(directory, entry)))
    return [p for _, p in sorted(found)]


def sweep_old(directory: str, max_age_s: float = DEFAULT_MAX_AGE_S, now: float | None = None) -> int:
    """Remove files of ``directory`` older than ``max_age_s`` (any writer's: by age only, ``age``); links are
    removed, never followed. Returns how many went."""
    now = time.time() if now is None else now
    gone = 0
    for entry, st in confined.entries(directory):
        if stat.S_ISDIR(st.st_mode) or age(st.st_mtime, now) <= max_age_s:
            continue
        try:
            gone += confined.unlink(os.path.join(directory, entry))
        except OSError:
            continue
    if gone:
        logger.info("freespec: state directory %s: removed %d file(s) older than %.0f days (or dated ahead of "
                    "this clock)", directory, gone, max_age_s / 86_400)
    return gone


def state_files(state_dir: str) -> list[tuple[str, float, int]]:
    """Every file a source keeps in ``state_dir`` (path, mtime, bytes), by source then name (``SOURCES``'
    folders and one level below: scopes, tombstones); links and temporaries included, as they take space too,
    and listed as links, never followed."""
    open_root(state_dir)
    out = []
    # only the sources' own folders, and the purge records': a wrong DIR loses nothing else
    for source in (*SOURCES, TOMBSTONES):
        folder = os.path.join(state_dir, source)
        for name, st in confined.entries(folder):
            path = os.path.join(folder, name)
            if stat.S_ISDIR(st.st_mode):  # suffix/<scope>/ and suffix/purged/
                out += [(os.path.join(path, inner), ist.st_mtime, ist.st_size) for inner, ist in confined.entries(path)]
                continue
            out.append((path, st.st_mtime, st.st_size))
    return out


def is_tombstone(path: str) -> bool:
    return os.path.basename(os.path.dirname(path)) == TOMBSTONES


def cap_total(state_dir: str, max_bytes: int, keep_newer_than_s: float = KEEP_NEWER_THAN_S,
              now: float | None = None) -> list[str]:
    """At a writer's start: while every writer's files together take more than ``max_bytes`` (option
    ``state_dir_max_mb``), remove the oldest, whoever wrote them (by age, as ``sweep_old``). A tombstone stays,
    and so does a file written in the last ``keep_newer_than_s`` (a live writer's: it saves what changed every
    ``save_every_s``; what it held is in its peers' merges too). Returns the removed paths. A Redis URL: none
    (its streams are bounded by their MAXLEN)."""
    if state_dir.startswith(("redis://", "rediss://")):
        return []
    now = time.time() if now is None else now
    files = [f for f in state_files(state_dir) if not is_tombstone(f[0])]
    total = sum(size for _, _, size in files)
    if total <= max_bytes:
        return []
    gone = []
    for path, mtime, size in sorted(files, key=lambda f: -age(f[1], now)):
        if total <= max_bytes or age(mtime, now) < keep_newer_than_s:
            break
        try:
            confined.unlink(path)  # gone already: another rank or replica starting at the same time
        except OSError:
            continue
        gone.append(path)
        total -= size
    if gone:
        logger.info("freespec: state directory %s: %d oldest file(s) removed, as all writers' files took more "
                    "than state_dir_max_mb (%.0f MB)", state_dir, len(gone), max_bytes / 1e6)
    if total > max_bytes:
        logger.warning("freespec: state directory %s holds %.0f MB, over state_dir_max_mb (%.0f MB), in files "
                       "written in the last %.0f minutes: lower state_max_mb or raise state_dir_max_mb",
                       state_dir, total / 1e6, max_bytes / 1e6, keep_newer_than_s / 60)
    return gone
