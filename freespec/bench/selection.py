"""Which questions each load level measures, and the warm-up prompts that are not among them."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from freespec.bench.errors import BenchError
from freespec.questions import Question

# Prompts used for warm-up only when every question of the file is measured.
FALLBACK_WARMUP_PROMPTS = (
    "Write a short poem about the sea.",
    "List three uses of a paperclip.",
    "Explain what a prime number is in two sentences.",
    "Translate 'good morning' into French, Spanish and German.",
)


def select_questions(
    questions: Sequence[Question], categories: Sequence[str] | None, per_category: int | None,
    offset: int = 0,
) -> OrderedDict[str, list[Question]]:
    """Questions grouped by category: ``per_category`` of each from the ``offset``-th on, in file order.

    Categories keep the order of ``categories`` when given, else file order.
    Unknown category names raise BenchError listing the known ones.
    """
    by_category: OrderedDict[str, list[Question]] = OrderedDict()
    for q in questions:
        by_category.setdefault(q.category, []).append(q)
    if categories:
        unknown = [c for c in categories if c not in by_category]
        if unknown:
            raise BenchError(
                f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                f"the questions file has: {', '.join(by_category)}"
            )
        wanted = list(OrderedDict.fromkeys(categories))
    else:
        wanted = list(by_category)
    selected: OrderedDict[str, list[Question]] = OrderedDict()
    for category in wanted:
        items = by_category[category][offset:]
        selected[category] = list(items if per_category is None else items[:per_category])
    return selected


def select_questions_per_level(
    questions: Sequence[Question], categories: Sequence[str] | None, per_category: Sequence[int] | None,
    levels: Sequence[int], new_per_level: bool,
) -> dict[int, OrderedDict[str, list[Question]]]:
    """The questions of each concurrency level.

    ``per_category``: None (all), one count for every level, or one count per level. Each level takes
    the first ones of each category, or with ``new_per_level`` the next ones after the earlier levels'
    (so a server kept across levels never sees a measured prompt twice).
    """
    counts: list[int | None] = [None] * len(levels) if per_category is None else list(per_category)
    if len(counts) == 1:
        counts *= len(levels)
    if len(counts) != len(levels):
        raise BenchError(f"--per-category has {len(counts)} values for {len(levels)} concurrency levels; "
                         "give one value, or one per level")
    if new_per_level and None in counts:
        raise BenchError("--new-questions-per-level needs --per-category")
    selected, offset = {}, 0
    for level, count in zip(levels, counts):
        selected[level] = select_questions(questions, categories, count, offset=offset if new_per_level else 0)
        offset += count or 0
    return selected


def select_warmup_prompts(questions: Sequence[Question], measured: Iterable[Question], count: int) -> list[str]:
    """``count`` warm-up prompts that are not measured prompts.

    Proposers with memory (vLLM's suffix decoding caches earlier responses)
    would otherwise have seen the measured answers. Takes unmeasured questions
    round-robin over categories in file order; falls back to built-in prompts.
    """
    if count <= 0:
        return []
    measured_ids = {(q.category, q.question_id) for q in measured}
    pools: OrderedDict[str, list[Question]] = OrderedDict()
    for q in questions:
        if (q.category, q.question_id) not in measured_ids:
            pools.setdefault(q.category, []).append(q)
    prompts: list[str] = []
    index = 0
    while len(prompts) < count and any(index < len(pool) for pool in pools.values()):
        for pool in pools.values():
            if index < len(pool) and len(prompts) < count:
                prompts.append(pool[index].prompt)
        index += 1
    fallback = 0
    while len(prompts) < count:
        prompts.append(FALLBACK_WARMUP_PROMPTS[fallback % len(FALLBACK_WARMUP_PROMPTS)])
        fallback += 1
    return prompts
