"""Stock vLLM's batch-size table: ``num_speculative_tokens_per_batch_size`` (vLLM 0.32,
``vllm/config/speculative.py``; dynamic speculative decoding), the K the scheduler drafts at each number of
requests in the batch, as ``[[first, last, K], ...]`` with inclusive batch-size ranges.

``ngram-table``, ``suffix-table`` and ``draft_model-table`` in ``--configs`` are vLLM's ``ngram``, ``suffix``
and ``draft_model`` with this table; without a table in their options they get ``default_table(K)``, the one
an operator would write from a sweep of K per load (issue 51; results/ngram-k-sweep measured one, which agrees
within its spread): the full K at 1 to 4 requests, half of it at 5 to 12, no speculation from 13 on (where
drafting costs more compute than it saves). With K = 8 that is ``[[1,4,8],[5,12,4],[13,512,0]]``.

vLLM clamps each entry's K to ``num_speculative_tokens``. Its own check of the table
(``vllm/v1/spec_decode/dynamic/utils.py``) runs in the server; ``check_table`` applies the same rules here,
so a bad table fails before a server starts.
"""
from __future__ import annotations

from typing import Any

TABLE_KEY = "num_speculative_tokens_per_batch_size"
# --configs name -> vLLM method; the table is added when the options give none.
TABLE_CONFIGS = {"ngram-table": "ngram", "suffix-table": "suffix", "draft_model-table": "draft_model"}
# The batch sizes at which the default table halves K and stops drafting, and its last batch size.
HALF_K_FROM, NO_SPECULATION_FROM, LAST_BATCH_SIZE = 5, 13, 512


def default_table(k: int) -> list[list[int]]:
    """The default batch-size table for ``num_speculative_tokens`` ``k``."""
    return [[1, HALF_K_FROM - 1, k], [HALF_K_FROM, NO_SPECULATION_FROM - 1, max(1, k // 2)],
            [NO_SPECULATION_FROM, LAST_BATCH_SIZE, 0]]


def check_table(table: Any) -> str | None:
    """What is wrong with a batch-size table by vLLM 0.32's rules, or None: a non-empty list of
    ``[first, last, K]`` integer triples, positive ranges with first <= last, K >= 0, ranges that do not
    overlap, the first starting at batch size 1."""
    if not isinstance(table, list) or not table:
        return "must be a non-empty list of [first batch size, last batch size, K] entries"
    entries = []
    for entry in table:
        if (not isinstance(entry, (list, tuple)) or len(entry) != 3
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in entry)):
            return f"entry {entry!r} is not three integers [first batch size, last batch size, K]"
        first, last, k = entry
        if first <= 0 or last <= 0:
            return f"entry {list(entry)}: batch sizes must be positive"
        if first > last:
            return f"entry {list(entry)}: the first batch size is above the last"
        if k < 0:
            return f"entry {list(entry)}: K must be 0 or more"
        entries.append((first, last, k))
    entries.sort()
    previous_last = 0
    for first, last, _ in entries:
        if first <= previous_last:
            return f"ranges overlap at batch size {first}"
        previous_last = last
    if entries[0][0] != 1:
        return "the first range must start at batch size 1"
    return None


def k_at(table: list[list[int]], batch_size: int, k_max: int) -> int:
    """The K vLLM drafts at ``batch_size`` with this table (gaps and the tail carry the previous K forward;
    every K clamped to ``k_max``), as vLLM's dense lookup gives it."""
    k = None
    for first, last, entry_k in sorted(table):
        if first > batch_size:
            break
        k = entry_k
    return min(k_max, k if k is not None else k_max)
