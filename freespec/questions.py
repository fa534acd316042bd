"""Benchmark questions: which set ``freespec bench`` measures on, and where it comes from.

Spec-Bench (Xia et al., 2024; Apache-2.0) is the reference set, but it is not freespec's to ship. It is
found in this order: an explicit path, ``$FREESPEC_QUESTIONS``, a cached copy under the user's cache
directory, then a download of the published ``question.jsonl`` (a fixed commit, SHA-256 checked) into
that cache. Offline with none of these, the built-in set (``freespec.builtin_prompts``) is used; the
returned ``QuestionSet`` says which, so every report can name it.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from freespec import settings
from freespec.safe_files import loads_json, open_regular

SPEC_BENCH_URL = "https://github.com/hemingkx/Spec-Bench"
SPEC_BENCH_COMMIT = "66230f10cb0a02aced5ef3ce1e85163c16160454"  # the commit that last changed the file
SPEC_BENCH_DOWNLOAD = ("https://raw.githubusercontent.com/hemingkx/Spec-Bench/"
                       f"{SPEC_BENCH_COMMIT}/data/spec_bench/question.jsonl")
SPEC_BENCH_SHA256 = "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04"
SPEC_BENCH_MAX_BYTES = 8 << 20  # the published file is about 0.5 MB
DOWNLOAD_TIMEOUT_S = 20.0
ENV_PATH = "FREESPEC_QUESTIONS"  # a question.jsonl to use when --questions is not given
ENV_URL = "FREESPEC_QUESTIONS_URL"  # where to download Spec-Bench from (a mirror); empty: never download
BUILTIN = "builtin"  # --questions builtin: freespec's own prompt set, whatever else is on the machine


class QuestionsError(ValueError):
    """The questions cannot be read; the message says what to do."""


@dataclass
class Question:
    question_id: Any
    category: str
    prompt: str


@dataclass
class QuestionSet:
    """The questions and a one-line account of where they came from."""

    questions: list[Question]
    name: str  # "spec-bench" or "builtin" or "file"
    origin: str  # a path, or how the set was made
    path: str | None = None  # the file read, if any (None: the built-in set)

    def describe(self) -> str:
        return f"{self.name} ({len(self.questions)} questions; {self.origin})"


def read_questions(path: Path) -> list[Question]:
    """All questions of a Spec-Bench-style ``question.jsonl``, in file order (first turn only)."""
    if not path.is_file():
        raise QuestionsError(
            f"questions file not found: {path}\nGive a Spec-Bench-style question.jsonl with --questions PATH "
            f"(or ${ENV_PATH}), or --questions {BUILTIN} for freespec's own prompt set. Spec-Bench publishes "
            f"its questions at {SPEC_BENCH_URL} (data/spec_bench/question.jsonl).")
    questions: list[Question] = []
    with open_regular(path, "r", encoding="utf-8") as fh:  # a FIFO or device is refused, never waited on
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = loads_json(line, what=f"{path}:{lineno}")
                turns = record["turns"]
                if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
                    raise ValueError("'turns' must be a non-empty list of strings")
                questions.append(Question(record["question_id"], str(record["category"]), turns[0]))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise QuestionsError(f"{path}:{lineno}: not a Spec-Bench question ({exc})") from None
    return questions


def builtin_questions() -> list[Question]:
    from freespec.builtin_prompts import builtin_prompts

    return [Question(f"builtin-{i}", category, prompt)
            for i, (category, prompt) in enumerate(builtin_prompts())]


def cache_path(env: Mapping[str, str] = os.environ) -> Path:
    """Where a downloaded Spec-Bench ``question.jsonl`` is kept: in freespec's cache root
    (``$FREESPEC_CACHE`` or ``~/.cache/freespec``, where prepared models are kept too)."""
    return settings.cache_root(env) / "spec_bench" / "question.jsonl"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch_url(url: str, timeout: float = DOWNLOAD_TIMEOUT_S, limit: int = SPEC_BENCH_MAX_BYTES) -> bytes:
    """The body at ``url``, refusing more than ``limit`` bytes."""
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - a fixed https URL or the user's
        data = response.read(limit + 1)
    if len(data) > limit:
        raise OSError(f"{url} is larger than {limit} bytes")
    return data


def download_spec_bench(dest: Path, url: str = SPEC_BENCH_DOWNLOAD,
                        fetch: Callable[[str], bytes] = fetch_url) -> None:
    """Download Spec-Bench's questions to ``dest`` (atomically), after checking their SHA-256.

    Raises OSError when the download fails or the file is not the published one.
    """
    data = fetch(url)
    if _sha256(data) != SPEC_BENCH_SHA256:
        raise OSError(f"{url} is not Spec-Bench's question.jsonl (SHA-256 {_sha256(data)}, "
                      f"expected {SPEC_BENCH_SHA256})")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".question.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def resolve_questions(questions: str | None, env: Mapping[str, str] = os.environ,
                      fetch: Callable[[str], bytes] = fetch_url,
                      log: Callable[[str], None] = lambda message: None) -> QuestionSet:
    """The question set to measure on (see the module docstring for the order).

    ``questions``: a path, ``"builtin"``, or None for the automatic order. An explicit path or
    ``$FREESPEC_QUESTIONS`` that cannot be read raises QuestionsError; a failed download falls back
    to the built-in set, saying why through ``log``.
    """
    if questions == BUILTIN:
        return QuestionSet(builtin_questions(), BUILTIN, "freespec's own prompt set, chosen with --questions")
    if questions:
        path = Path(questions)
        return QuestionSet(read_questions(path), "file", str(path.resolve()), str(path.resolve()))
    if settings.questions_path(env):
        path = Path(settings.questions_path(env))
        where = str(path.resolve())
        return QuestionSet(read_questions(path), "file", f"{where}, from ${ENV_PATH}", where)
    cached = cache_path(env)
    if cached.is_file():
        return QuestionSet(read_questions(cached), "spec-bench", f"cached at {cached}", str(cached))
    url = settings.questions_url(SPEC_BENCH_DOWNLOAD, env)
    if url:
        log(f"downloading Spec-Bench's questions from {url} to {cached}")
        try:
            download_spec_bench(cached, url, fetch)
            return QuestionSet(read_questions(cached), "spec-bench", f"downloaded to {cached}", str(cached))
        except (OSError, urllib.error.URLError, ValueError) as exc:
            log(f"could not download Spec-Bench's questions ({exc}); using freespec's built-in prompt set")
    return QuestionSet(builtin_questions(), BUILTIN,
                       "freespec's own prompt set: no --questions, no $FREESPEC_QUESTIONS, no cached "
                       "Spec-Bench, and no download")
