"""Which question set ``freespec bench`` measures on: explicit file, env, cache, download, built-in."""
from __future__ import annotations

import collections
import hashlib
import json
import os

import pytest

from freespec import questions as q
from freespec.builtin_prompts import CATEGORIES, builtin_prompts


def _rows(n=2):
    return "".join(json.dumps({"question_id": i, "category": "writing", "turns": [f"w{i}", "again"]}) + "\n"
                   for i in range(n))


@pytest.fixture()
def questions_file(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text(_rows(), encoding="utf-8")
    return path


def never_fetch(url):
    raise AssertionError(f"no download expected, got {url}")


def test_read_questions_uses_first_turn(questions_file):
    expected = [q.Question(0, "writing", "w0"), q.Question(1, "writing", "w1")]
    assert q.read_questions(questions_file) == expected


def test_missing_file_says_how_to_get_questions(tmp_path):
    with pytest.raises(q.QuestionsError) as info:
        q.read_questions(tmp_path / "question.jsonl")
    message = str(info.value)
    assert "https://github.com/hemingkx/Spec-Bench" in message and "--questions builtin" in message
    assert "FREESPEC_QUESTIONS" in message


def test_bad_question_line_names_the_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question_id": 1, "category": "a", "turns": ["x"]}\n{"question_id": 2}\n')
    with pytest.raises(q.QuestionsError, match=r"q.jsonl:2"):
        q.read_questions(path)


def test_explicit_path_wins_over_everything(questions_file, tmp_path):
    env = {"FREESPEC_QUESTIONS": str(tmp_path / "elsewhere.jsonl"), "FREESPEC_CACHE": str(tmp_path)}
    chosen = q.resolve_questions(str(questions_file), env=env, fetch=never_fetch)
    assert chosen.name == "file" and len(chosen.questions) == 2


def test_environment_variable_then_cache(questions_file, tmp_path):
    env = {"FREESPEC_QUESTIONS": str(questions_file), "FREESPEC_CACHE": str(tmp_path / "cache")}
    assert "FREESPEC_QUESTIONS" in q.resolve_questions(None, env=env, fetch=never_fetch).origin
    cached = q.cache_path({"FREESPEC_CACHE": str(tmp_path / "cache")})
    assert cached == tmp_path / "cache" / "spec_bench" / "question.jsonl"
    cached.parent.mkdir(parents=True)
    cached.write_text(_rows(3))
    chosen = q.resolve_questions(None, env={"FREESPEC_CACHE": str(tmp_path / "cache")}, fetch=never_fetch)
    assert chosen.name == "spec-bench" and len(chosen.questions) == 3 and "cached" in chosen.origin


def test_an_unreadable_env_file_is_an_error_not_a_silent_fallback(tmp_path):
    with pytest.raises(q.QuestionsError, match="not found"):
        q.resolve_questions(None, env={"FREESPEC_QUESTIONS": str(tmp_path / "nope.jsonl")}, fetch=never_fetch)


def test_download_is_checksum_verified_then_cached(tmp_path, monkeypatch):
    body = _rows(4).encode()
    monkeypatch.setattr(q, "SPEC_BENCH_SHA256", hashlib.sha256(body).hexdigest())
    env = {"FREESPEC_CACHE": str(tmp_path)}
    chosen = q.resolve_questions(None, env=env, fetch=lambda url: body)
    assert chosen.name == "spec-bench" and len(chosen.questions) == 4 and "downloaded" in chosen.origin
    assert q.cache_path(env).read_bytes() == body
    # The next run finds the cache and downloads nothing.
    assert q.resolve_questions(None, env=env, fetch=never_fetch).name == "spec-bench"
    assert not [p for p in q.cache_path(env).parent.iterdir() if p.name.endswith(".part")]


def test_a_file_that_is_not_spec_bench_is_refused_and_the_builtin_set_used(tmp_path):
    env = {"FREESPEC_CACHE": str(tmp_path)}
    said = []
    chosen = q.resolve_questions(None, env=env, fetch=lambda url: b'{"not": "spec-bench"}\n', log=said.append)
    assert chosen.name == "builtin"
    assert not q.cache_path(env).exists()
    assert any("SHA-256" in line for line in said)


def test_offline_falls_back_to_the_builtin_set_and_says_so(tmp_path):
    def offline(url):
        raise OSError("no network")

    said = []
    chosen = q.resolve_questions(None, env={"FREESPEC_CACHE": str(tmp_path)}, fetch=offline, log=said.append)
    assert chosen.name == "builtin" and "built-in" in said[-1] and "no network" in said[-1]
    # An empty $FREESPEC_QUESTIONS_URL turns the download off altogether.
    env = {"FREESPEC_CACHE": str(tmp_path), "FREESPEC_QUESTIONS_URL": ""}
    assert q.resolve_questions(None, env=env, fetch=never_fetch).name == "builtin"


def test_published_checksum_matches_the_pinned_commit():
    # The pin and the checksum are one fact: the file changed only in the commit pinned here.
    assert q.SPEC_BENCH_COMMIT in q.SPEC_BENCH_DOWNLOAD and len(q.SPEC_BENCH_SHA256) == 64


def test_builtin_set_has_every_category_and_is_stable():
    prompts = builtin_prompts()
    counts = collections.Counter(category for category, _ in prompts)
    assert set(counts) == set(CATEGORIES) and min(counts.values()) >= 4
    assert prompts == builtin_prompts()  # the same Python gives the same prompts
    assert len({p for _, p in prompts}) == len(prompts)  # no duplicates
    assert all(50 < len(p) < 4000 for _, p in prompts)
    chosen = q.resolve_questions("builtin", env=os.environ, fetch=never_fetch)
    assert [x.prompt for x in chosen.questions] == [p for _, p in prompts]
