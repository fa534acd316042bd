"""The workload suite beside Spec-Bench (``freespec bench --workload``): multi-turn sessions built at run
time from material on the machine, each workload its own table.

- ``code_edit``: a standard-library source file, edits asked for turn after turn, the whole file or
  function back each time;
- ``tool_loop``: a JSON tool schema, the model calling tools, deterministic results fed back;
- ``rag``: a long document (the language reference) and questions whose answers quote it;
- ``chat``: ShareGPT conversations, where the machine has them (else skipped with a message).

``session`` holds the session model and how one runs (turn after turn, as a client), ``sequencing`` the
sessions in flight, ``material`` the text found on the machine, ``runner`` the benchmark around them.
"""
from __future__ import annotations

from collections.abc import Sequence

from freespec.bench.errors import BenchError
from freespec.bench.workloads import chat, code_edit, rag, tool_loop
from freespec.bench.workloads.session import Workload

SPECBENCH = "specbench"
SUITE = "agent-suite"
WORKLOADS = (code_edit.NAME, tool_loop.NAME, rag.NAME, chat.NAME)
CHOICES = (SPECBENCH, *WORKLOADS, SUITE)


def workload_names(selected: Sequence[str]) -> list[str]:
    """The workloads ``--workload`` names (``agent-suite``: all of them), in the suite's order; empty for
    Spec-Bench alone. BenchError for an unknown name, or Spec-Bench mixed with workloads."""
    names = list(selected or [SPECBENCH])
    unknown = [n for n in names if n not in CHOICES]
    if unknown:
        raise BenchError(f"unknown workload {', '.join(unknown)}; choose from {', '.join(CHOICES)}")
    if SPECBENCH in names:
        if len(names) > 1:
            raise BenchError(f"--workload {SPECBENCH} runs alone (Spec-Bench's questions); the others "
                             "are run together in one run, e.g. --workload code-edit rag")
        return []
    wanted = set(WORKLOADS) if SUITE in names else set(names)
    return [n for n in WORKLOADS if n in wanted]


def build_workloads(names: Sequence[str], sessions: int, turns: int, source_chars: int, context_chars: int,
                    chat_data: str | None = None) -> list[Workload]:
    """The named workloads, built from this machine's material; one that cannot be built is returned with
    ``skipped`` set (why) and no sessions."""
    builders = {
        code_edit.NAME: lambda: code_edit.build(sessions, turns, source_chars),
        tool_loop.NAME: lambda: tool_loop.build(sessions, turns, source_chars),
        rag.NAME: lambda: rag.build(sessions, turns, context_chars),
        chat.NAME: lambda: chat.build(sessions, turns, context_chars, chat_data),
    }
    return [builders[name]() for name in names]
