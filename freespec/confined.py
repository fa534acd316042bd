"""Files under a trust boundary: a state directory that other processes (and maybe other users) can write.

``confine(root)`` declares a folder a boundary, once per process (``proposers.learned.state_dir`` does it for
``state_dir``). From then on every path below it that freespec reads, writes, lists or removes through this
module is reached one component at a time from a descriptor of ``root``, each opened with ``O_NOFOLLOW``
(``openat``): a symbolic link planted anywhere below the root (a scope folder, a tombstone folder, a writer's
own file name) is refused as ``PlantedLinkError``, never followed, so nothing outside the folder is ever read,
written or removed through it. The root itself is the operator's path and may be a link.

A file read under a boundary must belong to this process's user and be writable by no one else (group or
others); otherwise it is refused as ``UntrustedFileError`` (``trust_others=True``, option
``state_dir_trust_others``, lifts this where replicas run as different users). Folders are made mode 0700.

Paths outside every boundary are handled as before (``os`` calls that follow links): the legacy per-source
options name files the operator chose.
"""
from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Callable, Iterator


logger = logging.getLogger("freespec")

_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_READ = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
DIR_MODE = 0o700

# a boundary's spellings (as given, made absolute, and its real path) -> (its real path, trust others' files)
_roots: dict[str, tuple[str, bool]] = {}
_warned: set[str] = set()


class NotRegularFileError(OSError):
    """A path that is not a regular file (FIFO, device, socket, directory): refused before it is read."""


class PlantedLinkError(OSError):
    """A path freespec writes is a symbolic link or not a regular file: refused, nothing written through it."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def check_regular(path: str | os.PathLike) -> os.stat_result:
    """``os.stat(path)``, or ``NotRegularFileError`` if it is not a regular file (``FileNotFoundError`` if missing)."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(f"{os.fspath(path)!r} is {_kind(st.st_mode)}, not a regular file")
    return st


class UntrustedFileError(PlantedLinkError):
    """A file under a boundary owned by another user or writable by others: refused unless trusted."""


def confine(root: str, *, trust_others: bool = False) -> str:
    """Make ``root`` a boundary (created mode 0700 if missing, its parents too); warns once when users other than
    its owner may write it. Returns its real path."""
    if not os.path.isdir(root):
        os.makedirs(root, mode=DIR_MODE, exist_ok=True)
        logger.info("freespec: state directory %s created (mode 0700)", root)
    real = os.path.realpath(root)
    trust = trust_others or _roots.get(real, ("", False))[1]
    for spelling in {os.path.abspath(root), real}:
        _roots[spelling] = (real, trust)
    st = os.stat(real)
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX and real not in _warned:
        _warned.add(real)
        logger.warning("freespec: state directory %s can be written by users other than its owner (mode %o): "
                       "they could plant files there; make it 0700 (docs/security.md)", root, st.st_mode & 0o777)
    return real


def release(root: str) -> None:
    """Forget a boundary (tests)."""
    real = os.path.realpath(root)
    for spelling in [k for k, v in _roots.items() if v[0] == real]:
        del _roots[spelling]


def _split(path: str) -> tuple[str, list[str]] | None:
    """The boundary ``path`` lies in (its real path) and the components below it; None outside every boundary.
    Paths are matched as spelled (made absolute), against the spellings ``confine`` was given."""
    if not _roots:
        return None
    full = os.path.abspath(path)
    for base, (real, _) in list(_roots.items()):  # a copy: another thread may confine a folder meanwhile
        if full == base or full.startswith(base.rstrip(os.sep) + os.sep):
            rel = os.path.relpath(full, base)
            parts = [] if rel == "." else rel.split(os.sep)
            if ".." in parts:
                raise PlantedLinkError(f"{path!r} leaves the state directory {base!r}")
            return real, parts
    return None


def _refuse(path: str, e: OSError) -> PlantedLinkError:
    return PlantedLinkError(e.errno, f"{path!r} is a symbolic link or not a folder: freespec follows no link in "
                                     "a state directory; remove it")


def _walk(root: str, parts: list[str], path: str, create: bool) -> int:
    """A descriptor of the folder ``root/parts...``, each component opened without following links."""
    fd = os.open(root, _DIR)
    try:
        for part in parts:
            try:
                nxt = os.open(part, _DIR | _NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, DIR_MODE, dir_fd=fd)
                except FileExistsError:
                    pass
                nxt = os.open(part, _DIR | _NOFOLLOW, dir_fd=fd)
            except OSError as e:
                if e.errno in (getattr(os, "ELOOP", 40), getattr(os, "ENOTDIR", 20)):
                    raise _refuse(path, e) from None
                raise
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def folder(path: str, create: bool = False) -> Iterator[int]:
    """A descriptor of the folder ``path`` (made, mode 0700, with ``create``), links below a boundary refused."""
    where = _split(path)
    if where is None:
        if create:
            os.makedirs(path, mode=DIR_MODE, exist_ok=True)
        fd = os.open(path, _DIR)
    else:
        fd = _walk(where[0], where[1], path, create)
    try:
        yield fd
    finally:
        os.close(fd)


def makedirs(path: str) -> None:
    """``os.makedirs(path, 0o700, exist_ok=True)``, without following links below a boundary."""
    with folder(path, create=True):
        pass


def is_confined(path: str) -> bool:
    return _split(path) is not None


def open_read_fd(path: str | os.PathLike) -> int:
    """A read-only descriptor of the regular file ``path``, never blocking on a FIFO (``safe_files``). Below a
    boundary it is reached without following any link and its owner and mode are checked
    (``UntrustedFileError``); elsewhere a link is followed (the file it names at the time of the open)."""
    path = os.fspath(path)
    where = _split(path)
    if where is None:
        check_regular(path)
        fd = os.open(path, _READ & ~_NOFOLLOW)
        root = None
    else:
        root, parts = where
        if not parts:
            raise NotRegularFileError(f"{path!r} is a directory, not a regular file")
        with folder(os.path.dirname(os.path.abspath(path))) as dfd:
            st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)  # nothing but a file is opened at all
            if stat.S_ISLNK(st.st_mode):
                raise PlantedLinkError(f"{path!r} is a symbolic link: freespec follows no link in a state directory")
            if not stat.S_ISREG(st.st_mode):
                raise NotRegularFileError(f"{path!r} is {_kind(st.st_mode)}, not a regular file")
            try:
                fd = os.open(parts[-1], _READ, dir_fd=dfd)
            except OSError as e:
                if e.errno == getattr(os, "ELOOP", 40):
                    raise _refuse(path, e) from None
                raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped between the check and the open
            raise NotRegularFileError(f"{path!r} is {_kind(st.st_mode)}, not a regular file")
        if root is not None and not _roots[root][1] and (st.st_uid != os.geteuid() or st.st_mode & 0o022):
            raise UntrustedFileError(f"{path!r} belongs to another user or can be written by others "
                                     f"(uid {st.st_uid}, mode {st.st_mode & 0o777:o}): not read (option "
                                     "state_dir_trust_others allows it)")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def lstat(path: str) -> os.stat_result:
    """``os.lstat``, the folders on the way reached without following links below a boundary."""
    if _split(path) is None:
        return os.lstat(path)
    with folder(os.path.dirname(os.path.abspath(path))) as dfd:
        return os.stat(os.path.basename(path), dir_fd=dfd, follow_symlinks=False)


def exists(path: str) -> bool:
    try:
        lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def entries(path: str) -> list[tuple[str, os.stat_result]]:
    """The entries of the folder ``path`` (name, ``lstat``), by name; links are listed as links, never followed.
    A folder that is missing or a link lists nothing."""
    try:
        with folder(path) as dfd:
            out = []
            with os.scandir(dfd) as it:
                for e in it:
                    try:
                        out.append((e.name, e.stat(follow_symlinks=False)))
                    except OSError:
                        continue
            return sorted(out)
    except (OSError, PlantedLinkError):
        return []


def unlink(path: str) -> bool:
    """Remove the file (or link: the link itself) ``path``; False if it was not there. A folder on the way that
    is a link raises ``PlantedLinkError`` and nothing is removed."""
    try:
        with folder(os.path.dirname(os.path.abspath(path))) as dfd:
            os.unlink(os.path.basename(path), dir_fd=dfd)
    except FileNotFoundError:
        return False
    return True


def rmdir(path: str) -> None:
    with folder(os.path.dirname(os.path.abspath(path))) as dfd:
        os.rmdir(os.path.basename(path), dir_fd=dfd)


def write_atomic(path: str, tmp_name: str, fill: Callable[[object], None], perms: int) -> None:
    """Write ``path`` whole or not at all: ``fill(file)`` writes a new temporary file ``tmp_name`` beside it
    (``O_EXCL | O_NOFOLLOW``: a planted file or link there is an error), fsynced and renamed over ``path`` (a
    link planted at ``path`` is replaced, never written through); the folder is fsynced. On error the
    temporary file is removed and ``path`` left as it was."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    name = os.path.basename(path)
    directory = os.path.dirname(os.path.abspath(path))
    with folder(directory) as dfd:
        try:
            fd = os.open(tmp_name, flags, perms, dir_fd=dfd)
        except OSError as e:  # named by its whole path, as an open by path would
            raise type(e)(e.errno, e.strerror, os.path.join(directory, tmp_name)) from None
        try:
            with open(fd, "wb") as f:
                fill(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp_name, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name, dir_fd=dfd)
            raise
        with contextlib.suppress(OSError):
            os.fsync(dfd)


def touch(path: str, when: float) -> None:
    """Set ``path``'s times to ``when`` (not through a link)."""
    with folder(os.path.dirname(os.path.abspath(path))) as dfd:
        os.utime(os.path.basename(path), (when, when), dir_fd=dfd, follow_symlinks=False)


def read_small(path: str, limit: int) -> bytes:
    """A small regular file's bytes (at most ``limit``; more is an error), read as ``open_read_fd`` opens."""
    fd = open_read_fd(path)
    with open(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path!r}: more than the {limit} bytes read here")
    return data
