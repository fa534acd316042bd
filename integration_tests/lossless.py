"""The lossless criteria, as functions the tests (and the benchmark) apply to engine outputs."""
from __future__ import annotations

import numpy as np

# Two logits closer than this (in log-probability) are a numerical tie in float32:
# a different matrix-product shape may legitimately flip their order.
TIE_EPSILON = 1e-3


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token, or None when one sequence is the other (or equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def greedy_mismatches(base_ids, base_top2, other_ids, epsilon: float = TIE_EPSILON) -> list[str]:
    """Prompts whose greedy output differs from the baseline other than on a numerical tie."""
    problems = []
    for i, (a, b) in enumerate(zip(base_ids, other_ids)):
        pos = first_divergence(a, b)
        if pos is None:
            continue
        if pos >= len(a) or pos >= len(b):
            problems.append(f"prompt {i}: one output stops early at token {pos}")
            continue
        top = base_top2[i][pos]
        gap = top[0] - top[1] if len(top) == 2 else float("inf")
        if gap > epsilon:
            problems.append(f"prompt {i}: diverges at token {pos} where the target's top-2 differ by {gap:.2e}")
    return problems


def positionwise_chi2(samples_a: list[list[int]], samples_b: list[list[int]], positions: int) -> float:
    """Sum over positions of the two-sample chi-square statistic of the token at that position."""
    total = 0.0
    for pos in range(positions):
        a = [s[pos] if pos < len(s) else -1 for s in samples_a]
        b = [s[pos] if pos < len(s) else -1 for s in samples_b]
        cats = sorted(set(a) | set(b))
        table = np.array([[a.count(c) for c in cats], [b.count(c) for c in cats]], dtype=float)
        expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
        total += float(((table - expected) ** 2 / np.where(expected > 0, expected, 1)).sum())
    return total


def same_distribution_pvalue(samples_a, samples_b, positions: int, permutations: int = 1000, seed: int = 0) -> float:
    """Permutation test: are two sets of sampled sequences draws from one distribution?"""
    observed = positionwise_chi2(samples_a, samples_b, positions)
    pooled = list(samples_a) + list(samples_b)
    rng = np.random.default_rng(seed)
    n = len(samples_a)
    exceed = 0
    for _ in range(permutations):
        order = rng.permutation(len(pooled))
        perm = [pooled[i] for i in order]
        if positionwise_chi2(perm[:n], perm[n:], positions) >= observed:
            exceed += 1
    return (exceed + 1) / (permutations + 1)
