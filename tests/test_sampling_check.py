"""The sampling check's statistics (freespec/testing/lossless.py), on made-up token ids."""
from __future__ import annotations

import numpy as np

from freespec.testing.lossless import (
    PooledChi2,
    detection_power,
    distribution_pvalues,
    null_statistics,
    prefix_lengths,
    statistic,
    token_matrix,
)


def naive_chi2(a: list[list[int]], b: list[list[int]], positions: int) -> float:
    total = 0.0
    for pos in range(positions):
        xa = [s[pos] if pos < len(s) else -1 for s in a]
        xb = [s[pos] if pos < len(s) else -1 for s in b]
        cats = sorted(set(xa) | set(xb))
        table = np.array([[xa.count(c) for c in cats], [xb.count(c) for c in cats]], dtype=float)
        expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
        total += float(((table - expected) ** 2 / expected).sum())
    return total


def sampled(rng: np.random.Generator, n: int, positions: int = 6) -> list[list[int]]:
    """Sequences of a made-up distribution: each token 0..3, a few cut short."""
    return [list(rng.integers(0, 4, size=int(rng.integers(positions - 2, positions + 1)))) for _ in range(n)]


def test_the_pooled_chi2_is_the_positionwise_chi_square():
    rng = np.random.default_rng(1)
    a, b = sampled(rng, 30), sampled(rng, 40)
    got = PooledChi2(np.vstack([token_matrix(a, 6), token_matrix(b, 6)])).statistic(np.arange(30))
    assert abs(got - naive_chi2(a, b, 6)) < 1e-9


def test_token_matrix_pads_and_cuts():
    m = token_matrix([[5, 6], [1, 2, 3, 4]], 3)
    assert m.tolist() == [[5, 6, -1], [1, 2, 3]]


def test_prefix_lengths_count_the_common_prefix_with_the_draft():
    draft = np.array([1, 2, 3])
    assert prefix_lengths(np.array([[1, 2, 3], [1, 9, 3], [0, 2, 3]]), draft).tolist() == [3, 1, 0]


def test_the_prefix_statistic_is_one_sided():
    draft = np.array([1, 2, 3, 0])
    a = np.array([[1, 0, 0, 0], [0, 0, 0, 0]] * 10)
    follows = np.array([[1, 2, 3, 0]] * 20)
    assert statistic("prefix", a, follows, draft) > 0
    assert statistic("prefix", follows, a, draft) < 0


def test_same_distribution_passes_and_a_draft_following_set_fails():
    rng = np.random.default_rng(2)
    a, b = sampled(rng, 80), sampled(rng, 80)
    draft = [1, 2, 3, 0, 1, 2]
    same = distribution_pvalues(a, b, draft, 6, permutations=200)
    assert min(same.values()) > 0.01
    shifted = b[:40] + [draft] * 40
    p = distribution_pvalues(a, shifted, draft, 6, permutations=200)
    assert p["chi2"] < 0.01 and p["prefix"] < 0.01


def test_power_grows_with_the_share_shifted():
    rng = np.random.default_rng(3)
    a, b = token_matrix(sampled(rng, 60), 6), token_matrix(sampled(rng, 60), 6)
    draft = np.array([1, 2, 3, 0, 1, 2])
    critical = null_statistics("prefix", a, b, draft, 200, rng).max()
    low = detection_power("prefix", a, b, draft, 0.0, critical, 20, rng)
    high = detection_power("prefix", a, b, draft, 0.5, critical, 20, rng)
    assert low <= 0.1 and high == 1.0
