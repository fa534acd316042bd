"""A small benchmark prompt set that freespec writes itself, for machines without Spec-Bench.

Categories mirror Spec-Bench's where the task is the same (rewriting, code edits, extraction,
summarization, retrieval-augmented QA, translation, arithmetic word problems). The material is built
at run time from text that every CPython installation carries: the language reference topics in
``pydoc_data`` and the source of a few pure-Python standard-library functions; the word problems come
from a seeded generator. The same Python version gives the same prompts, so runs compare.
"""
from __future__ import annotations

import inspect
import random
import re
from typing import Iterator

PER_CATEGORY = 6
PASSAGE_CHARS = 1200  # long enough to copy from, short enough for a 2k-token context

# Language-reference topics to draw passages from, in order of preference.
TOPICS = ("with", "for", "try", "if", "while", "import", "assert", "return", "del", "global", "lambda",
          "raise", "pass", "class", "function", "yield")
# Pure-Python standard-library functions to edit (C-implemented or frozen ones are skipped).
FUNCTIONS = (("textwrap", "dedent"), ("string", "capwords"), ("colorsys", "rgb_to_hls"),
             ("colorsys", "hls_to_rgb"), ("calendar", "leapdays"), ("shlex", "quote"),
             ("fnmatch", "translate"), ("difflib", "get_close_matches"), ("heapq", "nsmallest"))
# Used only where pydoc_data is missing (some minimal Python builds leave it out).
FALLBACK_PASSAGES = (
    "A with statement wraps the execution of a block with methods defined by a context manager. The "
    "context expression is evaluated to obtain a context manager, its enter method is called, and the "
    "value it returns is bound to the target if one is given. The suite is then executed. Finally the "
    "exit method is called; if the suite raised an exception, its type, value and traceback are passed "
    "as arguments, and a true return value suppresses the exception.",
    "A for statement iterates over the elements of an iterable object. The iterable is evaluated once; "
    "an iterator is created for it, and the suite is executed once for each item the iterator provides, "
    "in the order they are returned. When the items are exhausted, the suite in the else clause, if "
    "present, is executed and the loop terminates. A break statement ends the loop without executing "
    "the else clause, and continue skips the rest of the suite and goes on with the next item.",
)

TEMPLATES = {
    "writing": "Rewrite the following passage in plain, friendly English for a beginner. Keep every "
               "technical term and every example.\n\n{passage}",
    "extraction": "From the passage below, list every Python keyword it mentions, one per line, each "
                  "followed by the sentence in which it first appears.\n\n{passage}",
    "summarization": "Summarize the following documentation in five bullet points.\n\n{passage}",
    "rag": "Answer the question using only the documentation below, and quote the sentences you rely "
           "on.\n\nDocumentation:\n{passage}\n\nQuestion: what does the `{topic}` statement do, and in "
           "which order are its parts evaluated?",
    "translation": "Translate the following text into French.\n\n{sentences}",
}
CODING = ("Add type hints to this Python function and rewrite its docstring in the Google style. Return "
          "the whole function.\n\n```python\n{source}```")
LANGUAGES = ("French", "German", "Spanish")


def _passages() -> list[tuple[str, str]]:
    """(topic, passage) pairs: whole sentences, at most ``PASSAGE_CHARS`` characters each."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return [(f"fallback-{i}", text) for i, text in enumerate(FALLBACK_PASSAGES)]
    found = []
    for topic in TOPICS:
        text = topics.get(topic)
        if text:
            body = re.sub(r"\s+", " ", text).strip()
            body = re.sub(r"^.*?\*{3,}\s*", "", body)  # the topic's title and its underline
            found.append((topic, _clip(body, PASSAGE_CHARS)))
    return found or [(f"fallback-{i}", text) for i, text in enumerate(FALLBACK_PASSAGES)]


def _clip(text: str, limit: int) -> str:
    """The longest run of whole sentences from the start that fits ``limit`` characters."""
    if len(text) <= limit:
        return text
    cut = text.rfind(". ", 0, limit)
    return text[: cut + 1] if cut > limit // 3 else text[:limit]


def _sentences(text: str, count: int) -> str:
    return " ".join(re.split(r"(?<=\.)\s+", text)[:count])


def _function_sources() -> list[str]:
    import importlib

    sources = []
    for module_name, name in FUNCTIONS:
        try:
            sources.append(inspect.getsource(getattr(importlib.import_module(module_name), name)))
        except (ImportError, AttributeError, OSError, TypeError):
            continue
    return sources


def _word_problems(count: int, seed: int = 2025) -> list[str]:
    rng = random.Random(seed)
    problems = []
    for _ in range(count):
        boxes, per_box = rng.randint(3, 12), rng.randint(6, 24)
        sold, price = rng.randint(5, 40), rng.randint(2, 9)
        problems.append(
            f"A shop receives {boxes} boxes with {per_box} notebooks in each. It sells {sold} notebooks on "
            f"Monday and then half of what is left on Tuesday, at {price} dollars each. How many notebooks "
            f"are left, and how much money did the shop take on the two days? Reason step by step, then "
            f"give the two numbers on the last line.")
    return problems


def _cycle(items: list, count: int) -> Iterator:
    for i in range(count):
        yield i, items[i % len(items)]


def builtin_prompts(per_category: int = PER_CATEGORY) -> list[tuple[str, str]]:
    """(category, prompt) pairs: ``per_category`` of each category, in a fixed order."""
    passages = _passages()
    prompts: list[tuple[str, str]] = []
    for shift, (category, template) in enumerate(TEMPLATES.items()):
        # Each category starts at another passage, so categories do not share their material.
        rotated = passages[shift % len(passages):] + passages[: shift % len(passages)]
        for i, (topic, passage) in _cycle(rotated, per_category):
            sentences = _sentences(passage, 3)
            if category == "translation":
                template_i = template.replace("French", LANGUAGES[i % len(LANGUAGES)])
            else:
                template_i = template
            prompts.append((category, template_i.format(passage=passage, topic=topic, sentences=sentences)))
    sources = _function_sources() or [inspect.getsource(_clip)]
    prompts += [("coding", CODING.format(source=source)) for _, source in _cycle(sources, per_category)]
    prompts += [("math_reasoning", p) for p in _word_problems(per_category)]
    return prompts


CATEGORIES: tuple[str, ...] = (*TEMPLATES, "coding", "math_reasoning")
