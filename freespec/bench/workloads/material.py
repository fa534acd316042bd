"""Text the workloads are built from, found on the machine at run time (nothing shipped): source files of
Python's standard library and its language reference (``pydoc_data``). The same Python gives the same
material, so runs compare; every choice is in a fixed order.
"""
from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

# Pure-Python standard-library modules whose code starts soon after their header, in the order sessions
# take them. Ones missing on a machine (a minimal build) are skipped.
SOURCE_MODULES = ("textwrap", "shlex", "fnmatch", "colorsys", "glob", "string", "graphlib", "bisect",
                  "netrc", "sched", "quopri", "tabnanny")
# Language-reference topics (pydoc_data.topics) a RAG document is made of, in order.
DOC_TOPICS = ("with", "for", "try", "if", "while", "import", "assert", "return", "raise", "class",
              "function", "lambda", "yield", "global", "del", "pass", "assignment", "augassign", "comparisons",
              "booleans", "atom-identifiers", "calls", "slicings", "subscriptions", "exprlists", "numbers",
              "strings", "integers", "floating", "dict", "lists", "typesseq", "typesmapping")


@dataclass
class SourceFile:
    """A trimmed source file: its name as a repository would show it, its text, its functions in order."""

    module: str
    path: str
    text: str
    functions: list[str]


def module_path(name: str) -> Path | None:
    """The ``.py`` file of a standard-library module, without importing it; None when there is none."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    return Path(origin) if origin and origin.endswith(".py") and Path(origin).is_file() else None


def trim_source(text: str, max_chars: int) -> str:
    """The code of a file from its first statement after the module docstring (the header of comments and
    docstring dropped), cut after the last whole top-level statement that fits ``max_chars``; when not even
    the first fits, cut after the last whole line that does."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return _cut_lines(text, max_chars)
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    if not body:
        return _cut_lines(text, max_chars)
    lines = text.splitlines(keepends=True)
    first = min([body[0].lineno] + [d.lineno for d in getattr(body[0], "decorator_list", [])]) - 1
    kept = ""
    for node in body:
        candidate = "".join(lines[first:node.end_lineno])
        if len(candidate) > max_chars:
            break
        kept = candidate
    return kept or _cut_lines("".join(lines[first:]), max_chars)


def _cut_lines(text: str, max_chars: int) -> str:
    out, size = [], 0
    for line in text.splitlines(keepends=True):
        if size + len(line) > max_chars:
            break
        out.append(line)
        size += len(line)
    return "".join(out)


def function_names(text: str) -> list[str]:
    """Names of the functions defined in ``text`` (methods as ``Class.method``), in order."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return re.findall(r"^\s*def (\w+)", text, flags=re.M)
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.append(node.name)
        elif isinstance(node, ast.ClassDef):
            names += [f"{node.name}.{item.name}" for item in node.body
                      if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return names


def source_files(count: int, max_chars: int, modules: tuple[str, ...] = SOURCE_MODULES) -> list[SourceFile]:
    """Up to ``count`` trimmed standard-library source files that define at least one function."""
    found = []
    for name in modules:
        if len(found) >= count:
            break
        path = module_path(name)
        if path is None:
            continue
        text = trim_source(path.read_text(encoding="utf-8", errors="replace"), max_chars)
        try:
            ast.parse(text)
        except SyntaxError:
            continue  # not even one whole top-level statement fits: a cut file is no file to edit
        functions = function_names(text)
        if functions:
            found.append(SourceFile(name, f"{name.replace('.', '/')}.py", text, functions))
    return found


def doc_topics() -> dict[str, str]:
    """The language reference's topics (``pydoc_data``), whitespace tidied; empty where it is missing."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return {}
    return {name: re.sub(r"[ \t]+\n", "\n", text).strip() for name, text in topics.items()}


def doc_document(max_chars: int, start: int = 0, topics: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """A long document of whole language-reference topics (from the ``start``-th of ``DOC_TOPICS`` on,
    wrapping round), at most ``max_chars`` characters (the first topic cut at a sentence when it alone is
    longer); the document and the topics in it. Without ``pydoc_data``: the docstrings of the standard
    library's source files (``docstring_document``)."""
    topics = doc_topics() if topics is None else topics
    names = [t for t in DOC_TOPICS if t in topics]
    if not names:
        return docstring_document(max_chars), []
    order = names[start % len(names):] + names[:start % len(names)]
    parts: list[str] = []
    used: list[str] = []
    size = 0
    for name in order:
        section = f"## {name}\n\n{topics[name]}\n\n"
        if size + len(section) > max_chars:
            if not parts:
                cut = section.rfind(". ", 0, max_chars)
                parts.append(section[: cut + 1] if cut > 0 else section[:max_chars])
                used.append(name)
            break
        parts.append(section)
        used.append(name)
        size += len(section)
    return "".join(parts).strip() + "\n", used


def docstring_document(max_chars: int) -> str:
    """The docstrings of ``SOURCE_MODULES``' functions, as one document of at most ``max_chars``."""
    parts, size = [], 0
    for name in SOURCE_MODULES:
        path = module_path(name)
        if path is None:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(node):
                section = f"## {name}.{node.name}\n\n{ast.get_docstring(node)}\n\n"
                if size + len(section) > max_chars:
                    return "".join(parts)
                parts.append(section)
                size += len(section)
    return "".join(parts)


def sentences(text: str) -> list[str]:
    """The document's sentences of 8 to 60 words (prose, not code or headings), in order."""
    prose = re.sub(r"\s+", " ", text)
    found = []
    for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z])", prose):
        sentence = re.sub(r"\s+\d+\.$", "", sentence.strip())  # a numbered list's next number
        words = sentence.split()
        if 8 <= len(words) <= 60 and sentence.endswith(".") and "##" not in sentence and "*" not in sentence:
            found.append(sentence.strip())
    return found
