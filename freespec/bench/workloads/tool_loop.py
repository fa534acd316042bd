"""Tool-call loops: an agent with a JSON tool schema in its system prompt, a task in a real repository (a
standard-library file), and several rounds of: the model calls a tool, the tool's result comes back. The
results are deterministic (a function of the call and the session's file), so every config gets the same
next turn when it gives the same answer; an answer without a call gets a fixed reminder instead."""
from __future__ import annotations

import json
import re
from typing import Any

from freespec.bench.workloads.material import SourceFile, source_files
from freespec.bench.workloads.session import Session, Workload

NAME = "tool-loop"
TOOLS = [
    {"name": "read_file", "description": "Read a file of the repository.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "search", "description": "Search the repository for a string; returns path:line: text for each hit.",
     "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}},
    {"name": "run_tests", "description": "Run the tests of one module and return their report.",
     "parameters": {"type": "object", "properties": {"module": {"type": "string"}}, "required": ["module"]}},
    {"name": "write_file", "description": "Replace a file of the repository with new content.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                    "required": ["path", "content"]}},
]
SYSTEM = ("You are a coding agent working in a Python repository. You can call these tools (JSON schema):\n\n"
          "{tools}\n\nTo call a tool, answer with one JSON object and nothing else, for example "
          '{{"tool": "read_file", "arguments": {{"path": "a/b.py"}}}}. The result comes back in the next '
          "message. When the task is done, answer with FINAL: and a summary.")
TASK = ("A user reports that `{function}` in `{path}` gives a wrong result for an empty input. Find the cause "
        "with the tools, fix it, and make the tests of `{module}` pass.")
NO_CALL = ('No tool call found in your answer. Call a tool with one JSON object, e.g. {"tool": "read_file", '
           '"arguments": {"path": "%s"}}, or answer FINAL: when the task is done.')
RESULT = "Tool result ({name}):\n```\n{result}\n```"
SEARCH_HITS = 12


def parse_tool_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """The first JSON object in ``text`` that names a tool (``tool`` or ``name``; arguments under
    ``arguments``, ``parameters`` or ``args``, or a JSON string of them), as (name, arguments); None without.
    Objects inside code fences and ``<tool_call>`` tags count."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if not isinstance(value, dict):
            continue
        name = value.get("tool", value.get("name"))
        if not isinstance(name, str) or not name:
            continue
        arguments = next((value[k] for k in ("arguments", "parameters", "args") if k in value), {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = {}
        return name, arguments if isinstance(arguments, dict) else {}
    return None


class Repository:
    """The tools' view of one session's repository: its one file."""

    def __init__(self, source: SourceFile, read_chars: int):
        self.source = source
        self.read_chars = read_chars

    def _is_file(self, path: Any) -> bool:
        return isinstance(path, str) and path.strip("./").endswith(self.source.path)

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """The tool's result: deterministic, from the call and the file only."""
        source = self.source
        if name == "read_file":
            path = arguments.get("path")
            if not self._is_file(path):
                return f"error: no such file: {path}; the repository has {source.path}"
            return source.text[: self.read_chars]
        if name == "search":
            query = str(arguments.get("query") or "")
            if not query:
                return "error: empty query"
            hits = [f"{source.path}:{n}: {line}" for n, line in enumerate(source.text.splitlines(), 1)
                    if query.lower() in line.lower()]
            return "\n".join(hits[:SEARCH_HITS]) or f"no match for {query!r}"
        if name == "run_tests":
            function = source.functions[0]
            return (f"collected 4 items\n\ntest_{source.module}.py ...F\n\nFAILED test_{source.module}.py::"
                    f"test_{function.replace('.', '_')}_empty - AssertionError: {function}('') returned None, "
                    f"expected ''\n1 failed, 3 passed in 0.04s")
        if name == "write_file":
            if not self._is_file(arguments.get("path")):
                return f"error: no such file: {arguments.get('path')}; the repository has {source.path}"
            return f"wrote {len(str(arguments.get('content') or ''))} characters to {source.path}"
        return f"error: unknown tool {name!r}; the tools are {', '.join(t['name'] for t in TOOLS)}"

    def respond(self, turn: int, answer: str) -> str | None:
        """The next user turn: the result of the answer's tool call, or a reminder to call one."""
        call = parse_tool_call(answer)
        if call is None:
            return NO_CALL % self.source.path
        name, arguments = call
        return RESULT.format(name=name, result=self.call(name, arguments))


def session_for(source: SourceFile, rounds: int, index: int, read_chars: int) -> Session:
    function = source.functions[index % len(source.functions)]
    repository = Repository(source, read_chars)
    return Session(f"{NAME}-{index}-{source.module}",
                   [TASK.format(function=function, path=source.path, module=source.module)],
                   system=SYSTEM.format(tools=json.dumps(TOOLS, indent=1)),
                   respond=repository.respond, max_turns=rounds)


def build(sessions: int, rounds: int, source_chars: int) -> Workload:
    """``sessions`` agent loops of ``rounds`` model turns each, on standard-library files."""
    files = source_files(sessions, source_chars)
    description = (f"tool-call loops: a JSON tool schema in the system prompt, {rounds} rounds of a tool call "
                   f"and its result (read_file returns a standard-library file of at most {source_chars} "
                   "characters)")
    if not files:
        return Workload(NAME, description, skipped="no standard-library source file to work on was found")
    return Workload(NAME, description, [session_for(files[i % len(files)], rounds, i, source_chars)
                                        for i in range(sessions)])
