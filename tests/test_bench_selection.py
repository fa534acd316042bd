"""Which questions each load level measures, and the warm-up prompts."""
from __future__ import annotations

import pytest
from bench_helpers import write_questions

from freespec.bench import selection
from freespec.questions import read_questions


@pytest.fixture
def questions_file(tmp_path):
    return write_questions(tmp_path)


def test_select_questions_filters_and_limits_in_file_order(questions_file):
    questions = read_questions(questions_file)
    selected = selection.select_questions(questions, ["rag", "writing"], 2)
    assert list(selected) == ["rag", "writing"]
    assert [q.prompt for q in selected["rag"]] == ["rag q0", "rag q1"]
    assert [q.question_id for q in selected["writing"]] == [1, 2]
    everything = selection.select_questions(questions, None, None)
    assert list(everything) == ["writing", "math", "rag"] and sum(map(len, everything.values())) == 9
    with pytest.raises(selection.BenchError, match="unknown category nope.*writing, math, rag"):
        selection.select_questions(questions, ["nope"], 1)


def test_new_questions_per_level_gives_each_level_the_next_ones(questions_file):
    questions = read_questions(questions_file)
    levels = selection.select_questions_per_level(questions, ["writing", "rag"], [1], [1, 4, 16], True)
    assert {c: [q.prompt for qs in sel.values() for q in qs] for c, sel in levels.items()} == {
        1: ["writing q0", "rag q0"], 4: ["writing q1", "rag q1"], 16: ["writing q2", "rag q2"]}
    same = selection.select_questions_per_level(questions, ["writing"], [2], [1, 8], False)
    assert same[1] == same[8] and [q.prompt for q in same[8]["writing"]] == ["writing q0", "writing q1"]
    # Past the end of a category: fewer (or no) questions, not an error.
    beyond = selection.select_questions_per_level(questions, ["math"], [2], [1, 2], True)
    assert [q.prompt for q in beyond[2]["math"]] == ["math q2"]
    # One count per level: the levels take 1, then 2 questions of each category.
    sweep = selection.select_questions_per_level(questions, ["rag"], [1, 2], [1, 39], True)
    assert [q.prompt for q in sweep[1]["rag"]] == ["rag q0"]
    assert [q.prompt for q in sweep[39]["rag"]] == ["rag q1", "rag q2"]
    with pytest.raises(selection.BenchError, match="2 values for 3 concurrency levels"):
        selection.select_questions_per_level(questions, None, [1, 2], [1, 4, 16], True)
    with pytest.raises(selection.BenchError, match="needs --per-category"):
        selection.select_questions_per_level(questions, None, None, [1, 4], True)


def test_warmup_prompts_avoid_measured_questions(questions_file):
    questions = read_questions(questions_file)
    selected = selection.select_questions(questions, ["writing", "math"], 2)
    measured = [q for qs in selected.values() for q in qs]
    warm = selection.select_warmup_prompts(questions, measured, 4)
    assert warm == ["writing q2", "math q2", "rag q0", "rag q1"]  # round-robin over unmeasured ones
    assert not set(warm) & {q.prompt for q in measured}
    # Everything measured: built-in prompts fill in.
    all_warm = selection.select_warmup_prompts(questions, questions, 2)
    assert len(all_warm) == 2 and not set(all_warm) & {q.prompt for q in questions}
    assert selection.select_warmup_prompts(questions, measured, 0) == []

