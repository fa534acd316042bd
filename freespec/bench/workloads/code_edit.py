"""Code-edit sessions: a real source file (a standard-library module, trimmed to ``--source-chars``), and
turn after turn the user asks for a change and the whole file, or the whole changed function, back. Every
turn's context holds the file, the earlier requests and the model's earlier versions: the answers re-emit
long spans of what is already in the context, with edits in between."""
from __future__ import annotations

from freespec.bench.workloads.material import SourceFile, source_files
from freespec.bench.workloads.session import Session, Workload

NAME = "code-edit"
SYSTEM = ("You are a careful coding assistant working on a Python repository. When asked for code, answer "
          "with the complete code in one ```python block, then one sentence on what changed.")
FIRST = "Here is `{path}` from our repository:\n\n```python\n{text}```\n\n{request}"
# The requests, in turn order (cycled past the last); {f} is one of the file's functions, a different one
# each turn. "file" asks for the whole file back, "function" for the whole changed function.
REQUESTS = (
    ("file", "Add type hints to `{f}`. Return the whole file with the change."),
    ("function", "Rewrite the docstring of `{f}` in the Google style, with Args and Returns sections. "
                 "Return the whole function `{f}`."),
    ("file", "Rename the local variables of `{f}` to clearer names, keeping its behaviour. Return the whole "
             "file again, with every change so far."),
    ("function", "Make `{f}` raise ValueError with a helpful message when it gets an argument of the wrong "
                 "type. Return the whole function `{f}`."),
    ("file", "Add a short comment above every function saying what it returns. Return the whole file."),
    ("function", "Undo the last change to `{f}` and return the whole function as it was before it."),
)


def request_text(turn: int, source: SourceFile) -> str:
    """The user's request of ``turn``: the edit and what to return, naming one of the file's functions."""
    _, template = REQUESTS[turn % len(REQUESTS)]
    function = source.functions[turn % len(source.functions)]
    return template.format(f=function)


def session_for(source: SourceFile, turns: int, index: int, shift: int = 0) -> Session:
    """A session on ``source``; ``shift`` starts it at a later request (sessions beyond the number of files
    reuse a file with other requests)."""
    messages = [FIRST.format(path=source.path, text=source.text, request=request_text(shift, source))]
    messages += [request_text(shift + turn, source) for turn in range(1, turns)]
    return Session(f"{NAME}-{index}-{source.module}", messages, system=SYSTEM)


def build(sessions: int, turns: int, source_chars: int) -> Workload:
    """``sessions`` sessions of ``turns`` turns, each on another standard-library file while there are
    files enough (then the files again, starting at later requests)."""
    files = source_files(sessions, source_chars)
    description = (f"code edits: a standard-library source file (at most {source_chars} characters), "
                   f"{turns} turns each asking for a change and the whole file or function back")
    if not files:
        return Workload(NAME, description, skipped=f"no standard-library source file of at most {source_chars} "
                                                   "characters with a whole function was found")
    return Workload(NAME, description, [session_for(files[i % len(files)], turns, i, shift=i // len(files))
                                        for i in range(sessions)])
