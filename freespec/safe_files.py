"""Reading files that an operator or a peer may have got wrong: every reader of freespec goes through here.

One rule per class of bad input (docs/reliability.md, "Files, JSON and peers"):

- ``open_regular``: only a regular file is opened. The path is checked with ``os.stat`` first, then opened
  with ``O_NONBLOCK`` (a FIFO swapped in between the check and the open cannot block the caller: opening a
  FIFO for reading without a writer returns at once with ``O_NONBLOCK``), and the opened descriptor is
  checked again with ``fstat``; a FIFO, device, socket or directory raises ``NotRegularFileError``. A
  symlink is followed: what counts is the file it names at the time of the open; below a state directory
  (``freespec.confined``) no link is followed.
- ``read_bounded``: a regular file read whole, refused beyond ``limit`` bytes (checked before reading).
- ``loads_json`` / ``load_json``: JSON with a size and a nesting-depth bound, a named ``JSONBoundError``
  instead of a ``RecursionError`` or an unbounded read.
- ``check_npy_header``: a ``.npy`` member's header length read and bounded before numpy reads the header
  (numpy reads a version-2/3 header of up to 4 GiB before it checks its own limit).
- ``short``: a value cut to a few hundred characters for a message (a 1,000,000-entry list never makes
  a 50 MB error).
- ``create_new`` / ``open_lock_file``: every file freespec creates or opens for writing in a folder others
  may write (the model cache, a datastore's folder, a state folder) is opened with ``O_NOFOLLOW`` and never
  truncated on open: a new file with ``O_EXCL`` (a planted file or link at its name is an error, never
  written through), a lock file without ``O_TRUNC`` (a planted link is refused, its target untouched).
- ``printable``: text read from a file, with control and format characters escaped, for a terminal: every
  command that prints what a file says goes through it, so a manifest cannot forge the command's output.

Config-stage checks of path options and of option types: ``freespec.option_checks``.
"""
from __future__ import annotations

import io
import json
import os
import re
import stat
import struct
import unicodedata
from typing import Any

from freespec import confined
# the errors and the check every reader shares, defined with the one reader in ``confined``
from freespec.confined import NotRegularFileError, PlantedLinkError, _kind, check_regular  # noqa: F401

MAX_JSON_DEPTH = 256
MAX_NPY_HEADER_BYTES = 1 << 16  # numpy writes headers of a few hundred bytes; its own default limit is 10,000
MESSAGE_CHARS = 300


class FileTooLargeError(ValueError):
    """A file larger than the reader's bound."""


class JSONBoundError(ValueError):
    """JSON nested deeper, or larger, than the reader's bound."""


def short(value: Any, limit: int = MESSAGE_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, saying how much was cut."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters)"


def clip(text: str, limit: int = MESSAGE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut (an error's own text in a message)."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit:,} more characters)"


# C0 and C1 controls and DEL, and the format and separator characters that move, hide or reorder text
# (bidirectional overrides, zero-width characters, U+2028/U+2029); lone surrogates cannot be printed at all.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
                          r"\ufeff\ufff9-\ufffb\ud800-\udfff]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: Any, *, newlines: bool = False) -> str:
    """``str(text)`` safe to print on a terminal: control and format characters as ``\\xNN`` / ``\\uNNNN``.

    ``newlines=True`` keeps line breaks (a multi-line report); otherwise a value prints as one line.
    Other Unicode format characters (category Cf) are escaped as well.
    """
    text = str(text)
    if newlines:
        return "\n".join(printable(line) for line in text.split("\n"))
    text = _UNPRINTABLE.sub(_escape, text)
    if not text.isascii():
        text = "".join(f"\\u{ord(c):04x}" if unicodedata.category(c) == "Cf" else c for c in text)
    return text


def open_regular_fd(path: str | os.PathLike) -> int:
    """A read-only descriptor of ``path``, a regular file; never blocks on a FIFO (see the module docstring).
    Below a state directory (``freespec.confined``) no link is followed and the file's owner is checked."""
    return confined.open_read_fd(path)


def open_regular(path: str | os.PathLike, mode: str = "rb", **kwargs):
    """``open(path, mode)`` for reading a regular file only (``"rb"`` or ``"r"`` with ``encoding``...)."""
    if any(c in mode for c in "wax+"):
        raise ValueError(f"open_regular reads only, got mode {mode!r}")
    return open(open_regular_fd(path), mode, **kwargs)


def read_bounded(path: str | os.PathLike, limit: int, what: str = "file") -> bytes:
    """A regular file's bytes, ``FileTooLargeError`` if it holds more than ``limit`` (checked before reading)."""
    with open_regular(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise FileTooLargeError(f"{what} {os.fspath(path)!r}: {size:,} bytes, more than the {limit:,} read here")
        data = f.read(limit + 1)
    if len(data) > limit:  # grew while read
        raise FileTooLargeError(f"{what} {os.fspath(path)!r}: more than the {limit:,} bytes read here")
    return data


def json_depth(value: Any) -> int:
    """The nesting depth of parsed JSON (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((v, depth + 1) for v in item if isinstance(v, (dict, list)))
    return deepest


def loads_json(text: str | bytes, *, what: str = "JSON", max_depth: int = MAX_JSON_DEPTH,
               max_bytes: int | None = None) -> Any:
    """``json.loads`` with a size and depth bound: ``JSONBoundError`` naming ``what`` beyond either.

    ``json.JSONDecodeError`` (a ``ValueError``) for text that is not JSON, as ``json.loads``.
    """
    if max_bytes is not None and len(text) > max_bytes:
        raise JSONBoundError(f"{what}: {len(text):,} bytes of JSON, more than the {max_bytes:,} read here")
    try:
        value = json.loads(text)
    except RecursionError:
        raise JSONBoundError(f"{what}: JSON nested too deeply (more than {max_depth} levels)") from None
    depth = json_depth(value)
    if depth > max_depth:
        raise JSONBoundError(f"{what}: JSON nested {depth} levels deep, more than the {max_depth} read here")
    return value


def load_json(path: str | os.PathLike, *, max_bytes: int, max_depth: int = MAX_JSON_DEPTH,
              what: str | None = None) -> Any:
    """A JSON file (a regular file, at most ``max_bytes``, nested at most ``max_depth``), UTF-8 (a BOM allowed)."""
    what = what or repr(os.fspath(path))
    data = read_bounded(path, max_bytes, what)
    return loads_json(data.decode("utf-8-sig"), what=what, max_depth=max_depth)


def check_npy_header(member, limit: int = MAX_NPY_HEADER_BYTES) -> io.BytesIO:
    """Read a ``.npy`` stream's magic and header, the header's length bounded by ``limit`` before it is read.

    Returns the magic and header as a stream for ``numpy.lib.format.read_magic`` and
    ``read_array_header_*``; ``member`` is left at the start of the data. ``ValueError`` for a header that
    is not a ``.npy`` one or longer than ``limit``.
    """
    magic = member.read(8)
    if len(magic) < 8 or magic[:6] != b"\x93NUMPY":
        raise ValueError("not a .npy array (no .npy magic)")
    major = magic[6]
    length_format = "<H" if major == 1 else "<I" if major in (2, 3) else None
    if length_format is None:
        raise ValueError(f".npy format version {major}.{magic[7]} is not read here")
    raw = member.read(struct.calcsize(length_format))
    if len(raw) < struct.calcsize(length_format):
        raise ValueError(".npy header truncated")
    (length,) = struct.unpack(length_format, raw)
    if length > limit:
        raise ValueError(f".npy header of {length:,} bytes, more than the {limit:,} read here")
    header = member.read(length)
    if len(header) < length:
        raise ValueError(".npy header truncated")
    return io.BytesIO(magic + raw + header)


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def create_new(path: str | os.PathLike, mode: str = "wb", perms: int = 0o666, **kwargs):
    """``open(path, mode)`` for a file that must not exist yet (``O_EXCL | O_NOFOLLOW``): ``FileExistsError``
    when anything (a file, a planted symlink) is at ``path``; nothing is ever written through a link."""
    if mode not in ("w", "wb"):
        raise ValueError(f"create_new writes a new file, got mode {mode!r}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, perms)
    try:
        return open(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def open_lock_file(path: str | os.PathLike) -> int:
    """A descriptor of the lock file ``path`` (created if missing, never truncated) for ``fcntl.flock``.

    ``PlantedLinkError`` naming the file when ``path`` is a symbolic link or not a regular file: its target
    is neither opened for writing nor emptied.
    """
    flags = os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if os.path.islink(path):
            raise PlantedLinkError(e.errno, f"lock file {os.fspath(path)!r} is a symbolic link; freespec does not "
                                   "write through links in shared folders: remove it") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise PlantedLinkError(f"lock file {os.fspath(path)!r} is {_kind(st.st_mode)}, not a regular file: remove it")
    return fd


def fsync_directory(path: str | os.PathLike) -> None:
    """Make a rename in ``path`` durable (Linux); a platform or filesystem that cannot fsync a folder is let be."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a temporary file named by a dead writer's pid can be removed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, another user's
        return True
    return True
