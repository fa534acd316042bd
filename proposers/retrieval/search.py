"""Suffix-array queries over memory-mapped token arrays (numba; called per request per step).

``sa_range`` finds the block of a suffix array whose suffixes start with a pattern by two
binary searches: O(m log n) token comparisons for a pattern of m tokens in a shard of n,
so query cost grows with the logarithm of the datastore, not with its size.
``longest_match`` finds the longest suffix of a context (between ``min_m`` and ``max_m``
tokens) that occurs in a shard. Occurrence is monotone in the length (if the last m tokens
occur, so do the last m - 1), so it binary-searches the length too: about
log2(max_m - min_m) range queries instead of one per length.
``continuations`` reads what followed a bounded, evenly spaced sample of the occurrences.
"""
from __future__ import annotations

import numpy as np
from numba import njit

NO_TOKEN = -1


@njit(cache=True)
def _compare(tokens, start, pattern):
    """-1 / 0 / 1: the suffix at ``start`` (its first len(pattern) tokens) vs the pattern."""
    n = tokens.shape[0]
    for j in range(pattern.shape[0]):
        if start + j >= n:
            return -1  # a suffix that ends first sorts first
        t = tokens[start + j]
        p = pattern[j]
        if t < p:
            return -1
        if t > p:
            return 1
    return 0


@njit(cache=True)
def sa_range(tokens, sa, pattern):
    """[lo, hi): the suffix-array entries whose suffixes start with ``pattern``."""
    lo, hi = 0, sa.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if _compare(tokens, np.int64(sa[mid]), pattern) < 0:
            lo = mid + 1
        else:
            hi = mid
    first = lo
    hi = sa.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if _compare(tokens, np.int64(sa[mid]), pattern) <= 0:
            lo = mid + 1
        else:
            hi = mid
    return first, lo


@njit(cache=True)
def longest_match(tokens, sa, context, min_m, max_m):
    """(m, lo, hi) for the longest suffix of ``context`` of min_m..max_m tokens in the shard; m = 0 if none."""
    max_m = min(max_m, context.shape[0])
    best_m, best_lo, best_hi = 0, 0, 0
    lo_m, hi_m = min_m, max_m
    while lo_m <= hi_m:
        m = (lo_m + hi_m) // 2
        lo, hi = sa_range(tokens, sa, context[context.shape[0] - m :])
        if hi > lo:
            best_m, best_lo, best_hi = m, lo, hi
            lo_m = m + 1
        else:
            hi_m = m - 1
    return best_m, best_lo, best_hi


@njit(cache=True)
def continuations(tokens, sa, lo, hi, m, length, samples, separator):
    """[min(samples, hi - lo), length] int64: what followed each sampled occurrence (-1 past a document's end)."""
    count = hi - lo
    s = min(samples, count)
    out = np.full((s, length), NO_TOKEN, dtype=np.int64)
    n = tokens.shape[0]
    for i in range(s):
        # Evenly spaced over the block, so a frequent pattern is sampled across the whole corpus.
        pos = np.int64(sa[lo + (i * count) // s]) + m
        for j in range(length):
            if pos + j >= n:
                break
            t = tokens[pos + j]
            if t == separator:
                break
            out[i, j] = t
    return out
