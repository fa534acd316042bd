"""The workload suite's pure logic: material found on the machine, sessions built from it, turns sent one
after another with the whole conversation (a fake client), tool calls parsed, ShareGPT data read."""
from __future__ import annotations

import ast
import json
import threading
import time

import pytest

from freespec.bench.errors import BenchError
from freespec.bench.workloads import build_workloads, chat, code_edit, material, rag, tool_loop, workload_names
from freespec.bench.workloads.sequencing import run_sessions
from freespec.bench.workloads.session import Session, run_session, turn_id


def echo_send(log=None):
    """A fake client: answers ``answer N`` (N = the number of user turns so far) and records each chat."""
    def send(messages):
        if log is not None:
            log.append(messages)
        users = sum(m["role"] == "user" for m in messages)
        return {"output": f"answer {users}", "completion_tokens": 2, "error": None}
    return send


def test_workload_names_expand_the_suite_and_keep_specbench_apart():
    assert workload_names(["specbench"]) == [] and workload_names([]) == []
    assert workload_names(["agent-suite"]) == ["code-edit", "tool-loop", "rag", "chat"]
    assert workload_names(["rag", "code-edit"]) == ["code-edit", "rag"]  # the suite's order
    with pytest.raises(BenchError, match="runs alone"):
        workload_names(["specbench", "rag"])
    with pytest.raises(BenchError, match="unknown workload"):
        workload_names(["nope"])


def test_trim_source_keeps_whole_statements_within_the_limit():
    text = '"""Module docstring."""\nimport os\n\n\ndef a():\n    return 1\n\n\ndef b():\n    return 2\n'
    trimmed = material.trim_source(text, 40)
    assert trimmed.startswith("import os") and "def a" in trimmed and "def b" not in trimmed
    ast.parse(trimmed)
    assert material.trim_source(text, 1000).endswith("return 2\n")
    assert material.function_names(text) == ["a", "b"]
    assert material.function_names("class C:\n    def m(self):\n        pass\n") == ["C.m"]


def test_source_files_are_real_stdlib_files_trimmed_deterministically():
    files = material.source_files(3, 2000)
    assert files and all(len(f.text) <= 2000 and f.functions for f in files)
    for f in files:
        ast.parse(f.text)
        assert f.text in material.module_path(f.module).read_text()  # a real file, a slice of it
    assert [f.text for f in material.source_files(3, 2000)] == [f.text for f in files]


def test_doc_document_is_whole_topics_up_to_the_size():
    topics = {"with": "The with statement. " * 20, "for": "A for loop runs a suite for each item of it. " * 10}
    doc, used = material.doc_document(800, topics=topics)
    assert used == ["with"] and len(doc) <= 800
    doc, used = material.doc_document(5000, start=1, topics=topics)
    assert used == ["for", "with"] and doc.startswith("## for")


def test_code_edit_sessions_carry_the_file_and_ask_for_it_back():
    workload = code_edit.build(sessions=2, turns=3, source_chars=2500)
    assert workload.name == "code-edit" and len(workload.sessions) == 2 and not workload.skipped
    session = workload.sessions[0]
    assert session.system and len(session.turns) == 3
    assert "```python" in session.turns[0] and "Return the whole" in session.turns[0]
    assert all(("whole file" in t or "whole function" in t) for t in session.turns[:2])
    assert session.session_id != workload.sessions[1].session_id
    # More sessions than files: files again, other requests first.
    many = code_edit.build(sessions=len(material.SOURCE_MODULES) + 2, turns=2, source_chars=2500)
    assert len({s.session_id for s in many.sessions}) == len(many.sessions)


def test_code_edit_is_skipped_with_a_reason_when_nothing_fits():
    workload = code_edit.build(sessions=1, turns=2, source_chars=10)
    assert workload.skipped and not workload.sessions


def test_run_session_sends_each_turn_with_the_earlier_turns_and_answers():
    log = []
    session = Session("s", ["first", "second", "third"], system="sys")
    records = run_session(session, echo_send(log))
    assert [r["question_id"] for r in records] == ["s/t0", "s/t1", "s/t2"] == [turn_id("s", i) for i in range(3)]
    assert log[2] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "first"},
                      {"role": "assistant", "content": "answer 1"}, {"role": "user", "content": "second"},
                      {"role": "assistant", "content": "answer 2"}, {"role": "user", "content": "third"}]


def test_a_failed_turn_ends_its_session():
    def send(messages):
        return {"output": None, "error": "HTTP 400"} if len(messages) > 1 else {"output": "ok", "error": None}
    records = run_session(Session("s", ["a", "b", "c"]), send)
    assert [r["turn"] for r in records] == [0, 1] and records[1]["error"] == "HTTP 400"


def test_sessions_run_concurrently_but_each_turn_waits_for_the_previous_answer():
    lock = threading.Lock()
    in_flight, peak, order = {}, [0], []

    def send(messages):
        sid = messages[0]["content"].split()[0]
        with lock:
            assert not in_flight.get(sid), "a session sent a turn before its previous answer arrived"
            in_flight[sid] = True
            peak[0] = max(peak[0], sum(in_flight.values()))
            order.append((sid, sum(m["role"] == "user" for m in messages)))
        time.sleep(0.02)
        with lock:
            in_flight[sid] = False
        return {"output": "x", "error": None}

    sessions = [Session(f"s{i}", [f"s{i} go", "more", "more"]) for i in range(4)]
    records, wall = run_sessions(sessions, 2, send)
    assert peak[0] == 2 and wall > 0
    assert [(r["session_id"], r["turn"]) for r in records] == [(f"s{i}", t) for i in range(4) for t in range(3)]
    for i in range(4):
        assert [n for sid, n in order if sid == f"s{i}"] == [1, 2, 3]


def test_parse_tool_call_finds_the_first_json_call():
    assert tool_loop.parse_tool_call('{"tool": "read_file", "arguments": {"path": "a.py"}}') == (
        "read_file", {"path": "a.py"})
    text = 'I will search.\n<tool_call>\n{"name": "search", "arguments": "{\\"query\\": \\"def\\"}"}\n</tool_call>'
    assert tool_loop.parse_tool_call(text) == ("search", {"query": "def"})
    assert tool_loop.parse_tool_call('```json\n{"x": 1} {"tool": "run_tests", "args": {"module": "m"}}\n```') == (
        "run_tests", {"module": "m"})
    assert tool_loop.parse_tool_call("no call here {not json}") is None


def test_tool_loop_feeds_back_deterministic_results():
    workload = tool_loop.build(sessions=1, rounds=4, source_chars=2000)
    session = workload.sessions[0]
    assert '"read_file"' in session.system and session.max_turns == 4
    schema = session.system.split("schema):\n\n")[1].split("\n\nTo call")[0]
    assert [t["name"] for t in json.loads(schema)] == ["read_file", "search", "run_tests", "write_file"]
    source = material.source_files(1, 2000)[0]
    read = session.message(1, json.dumps({"tool": "read_file", "arguments": {"path": source.path}}))
    assert read.startswith("Tool result (read_file)") and source.text[:200] in read
    assert read == session.message(1, json.dumps({"tool": "read_file", "arguments": {"path": source.path}}))
    assert "no such file" in session.message(1, '{"tool": "read_file", "arguments": {"path": "x.py"}}')
    assert "No tool call found" in session.message(2, "I think the bug is obvious.")
    assert "1 failed, 3 passed" in session.message(2, '{"tool": "run_tests", "arguments": {"module": "m"}}')
    assert "unknown tool" in session.message(2, '{"tool": "rm", "arguments": {}}')
    assert session.message(4, '{"tool": "search", "arguments": {"query": "def"}}') is None  # rounds done
    records = run_session(session, echo_send())
    assert len(records) == 4 and all(r["error"] is None for r in records)


def test_rag_questions_quote_the_document():
    workload = rag.build(sessions=2, turns=3, context_chars=5000)
    first = workload.sessions[0]
    assert first.turns[0].startswith("Documentation:") and len(first.turns[0]) > 3000
    assert all("Quote" in t or "quote" in t.lower() for t in first.turns)
    document = first.turns[0]
    for turn in first.turns:
        phrase = turn.split('"')[1]
        assert " ".join(phrase.split()) in " ".join(document.split())
    assert workload.sessions[1].turns[0] != first.turns[0]  # another document


def test_chat_is_skipped_without_sharegpt_data(monkeypatch):
    monkeypatch.setattr(chat, "installed_data_files", lambda: [])
    workload = chat.build(2, 3, 5000)
    assert workload.skipped and "ShareGPT" in workload.skipped and not workload.sessions
    assert "no such file" in chat.build(2, 3, 5000, data="/nonexistent.json").skipped


def test_chat_replays_the_human_turns_of_sharegpt_conversations(tmp_path):
    data = [
        {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"id": "b", "conversations": [{"from": "human", "value": "q1"}, {"from": "gpt", "value": "a1"},
                                      {"from": "human", "value": "q2"}, {"from": "gpt", "value": "a2"},
                                      {"from": "human", "value": "q3"}]},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    workload = chat.build(sessions=3, turns=2, max_chars=100, data=str(path))
    assert [s.turns for s in workload.sessions] == [["q1", "q2"]]  # one-turn conversations are left out
    jsonl = tmp_path / "sharegpt.jsonl"
    jsonl.write_text("\n".join(json.dumps(d) for d in data))
    assert chat.conversations(jsonl, 5, 3, 100) == [["q1", "q2", "q3"]]


def test_build_workloads_builds_the_suite_from_this_machine(monkeypatch):
    monkeypatch.setattr(chat, "installed_data_files", lambda: [])
    built = build_workloads(workload_names(["agent-suite"]), 2, 2, 2500, 4000)
    assert [w.name for w in built] == ["code-edit", "tool-loop", "rag", "chat"]
    assert [bool(w.sessions) for w in built] == [True, True, True, False]


def test_workload_report_has_a_table_per_workload_with_its_passes():
    from freespec.bench.stats import aggregate
    from freespec.bench.workloads.report import render_workload_tables
    from freespec.bench.workloads.session import Workload

    requests, blocks = [], []
    for config in ("none", "hybrid"):
        for category in ("code-edit", "code-edit · restart", "rag"):
            requests.append({"config": config, "concurrency": 1, "category": category, "question_id": "s/t0",
                             "output": "same", "completion_tokens": 10, "latency_s": 1.0, "error": None})
            blocks.append({"config": config, "concurrency": 1, "category": category, "wall_s": 1.0, "spec": None})
    rows = aggregate(requests, blocks)
    workloads = [Workload("code-edit", "edits", [Session("s", ["a"])]), Workload("rag", "quotes", [Session("s", ["a"])]),
                 Workload("chat", "chats", skipped="no data")]
    text = render_workload_tables(rows, workloads, ["restart"], [("suffix-table", "server died: boom")], "bfloat16")
    code_edit_part = text.split("## rag")[0]
    assert "| hybrid | code-edit · restart |" in code_edit_part and "`code-edit · restart`: the same sessions" in text
    assert "| hybrid | rag |" not in code_edit_part
    assert text.count("| suffix-table | server died: boom |") == 2  # in each workload's table
    assert "## chat\n\nchats; 0 sessions.\n\nskipped: no data" in text
    assert "## All workloads" in text and text.count("identity check") == 1  # the bfloat16 note once
