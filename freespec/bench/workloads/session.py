"""A multi-turn session as a client runs it, and a workload (a named list of sessions).

A session's user turns are either written out in advance (code edits, RAG questions, chat) or made from the
model's previous answer (tool loops: the tool result of the call the answer makes). ``run_session`` sends
them as a client does: the next turn only once the previous answer has arrived, every turn's context holding
the earlier turns and answers.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, str]
# Sends a chat (the whole message list) and returns the request's record: output, tokens, timings, error.
Send = Callable[[list[Message]], dict[str, Any]]


@dataclass
class Session:
    """One conversation: a system prompt, the user's turns, or a first turn and ``respond``, which makes
    turn ``i`` (``i`` >= 1) from the answer to turn ``i - 1`` (None ends the session early)."""

    session_id: str
    turns: list[str]
    system: str | None = None
    respond: Callable[[int, str], str | None] | None = None
    max_turns: int | None = None  # with ``respond``: the number of turns

    def message(self, turn: int, previous_answer: str | None) -> str | None:
        """The user's message of ``turn`` (0-based), None when the session is over."""
        if turn < len(self.turns) and (self.respond is None or turn == 0):
            return self.turns[turn]
        if self.respond is None or turn >= (self.max_turns or len(self.turns)) or previous_answer is None:
            return None
        return self.respond(turn, previous_answer)


@dataclass
class Workload:
    """A named set of sessions, one table in the report."""

    name: str
    description: str
    sessions: list[Session] = field(default_factory=list)
    skipped: str | None = None  # why the workload could not be built on this machine (then no sessions)

    def turn_count(self) -> int:
        """Turns at most over all sessions (a tool loop's are its ``max_turns``)."""
        return sum(s.max_turns or len(s.turns) for s in self.sessions)


def turn_id(session_id: str, turn: int) -> str:
    """A turn's ``question_id``: outputs are compared with the baseline's turn by turn."""
    return f"{session_id}/t{turn}"


def run_session(session: Session, send: Send, on_turn: Callable[[], None] | None = None) -> list[dict[str, Any]]:
    """Every turn of ``session`` in order, each sent with the whole conversation so far once the previous
    answer has arrived. Returns one record per turn sent (``session_id``, ``turn``, ``question_id`` and the
    request's own fields); a failed turn ends the session, since its answer is what the next turn builds on."""
    messages: list[Message] = [{"role": "system", "content": session.system}] if session.system else []
    records: list[dict[str, Any]] = []
    answer: str | None = None
    turn = 0
    while True:
        text = session.message(turn, answer)
        if text is None:
            break
        messages.append({"role": "user", "content": text})
        result = send([dict(m) for m in messages])
        records.append({"session_id": session.session_id, "turn": turn,
                        "question_id": turn_id(session.session_id, turn), **result})
        if on_turn:
            on_turn()
        if result.get("error") or result.get("output") is None:
            break
        answer = result["output"]
        messages.append({"role": "assistant", "content": answer})
        turn += 1
    return records
