"""The lossless criteria, as functions the tests (and the benchmark) apply to engine outputs (``freespec.testing``)."""
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


# The sampling check: two sets of sampled sequences (with and without speculation) from one distribution?
# Two statistics, each against permutations of the two sets pooled, each at p <= SAME_P (so both at 0.001):
# - "chi2": the sum over positions of the two-sample chi-square of the token at each position (any shift);
# - "prefix": the second set's mean length of common prefix with the draft's text less the first set's (one-sided:
#   a verification that accepts drafts too often makes requests follow the draft). Measured power in
#   docs/reliability.md.
STATISTICS = ("chi2", "prefix")
SAME_P = 0.0005
# A permutation p-value is at least 1 / (permutations + 1). At 1000 permutations (the default until 2026-11-28)
# that is 0.000999, above SAME_P: the check could not fail (a set with 60 of 160 samples replaced by the draft
# got p = 0.000999 for both statistics and passed). 4000 lets p fall to 0.00025 (about 1.2 s for 160 + 160
# samples of 24 tokens).
PERMUTATIONS = 4000


def token_matrix(samples, positions: int) -> np.ndarray:
    """(n, positions) token ids, -1 past a sample's end."""
    out = np.full((len(samples), positions), -1, dtype=np.int64)
    for i, s in enumerate(samples):
        s = list(s)[:positions]
        out[i, : len(s)] = s
    return out


class PooledChi2:
    """The chi2 statistic of any split of a pooled set, vectorised so that permutations are cheap."""

    def __init__(self, pooled: np.ndarray) -> None:
        self.inverse = [np.unique(pooled[:, p], return_inverse=True)[1].ravel() for p in range(pooled.shape[1])]
        self.totals = [np.bincount(inv) for inv in self.inverse]
        self.n = len(pooled)

    def statistic(self, first: np.ndarray) -> float:
        """The statistic of the rows ``first`` (indices) against the rest."""
        na, total = len(first), 0.0
        for inv, tot in zip(self.inverse, self.totals):
            ca = np.bincount(inv[first], minlength=len(tot)).astype(float)
            cb = tot - ca
            ea, eb = tot * na / self.n, tot * (self.n - na) / self.n
            total += float(((ca - ea) ** 2 / ea).sum() + ((cb - eb) ** 2 / eb).sum())
        return total


def prefix_lengths(samples: np.ndarray, draft: np.ndarray) -> np.ndarray:
    """Each sample's length of common prefix with ``draft`` (token matrices of one width)."""
    return np.cumprod(samples == draft[None, :], axis=1).sum(axis=1)


def statistic(name: str, a: np.ndarray, b: np.ndarray, draft: np.ndarray) -> float:
    if name == "chi2":
        return PooledChi2(np.vstack([a, b])).statistic(np.arange(len(a)))
    return float(prefix_lengths(b, draft).mean() - prefix_lengths(a, draft).mean())


def null_statistics(name: str, a: np.ndarray, b: np.ndarray, draft: np.ndarray, permutations: int,
                    rng: np.random.Generator) -> np.ndarray:
    """The statistic under ``permutations`` random relabellings of A and B pooled."""
    pooled, na = np.vstack([a, b]), len(a)
    orders = [rng.permutation(len(pooled)) for _ in range(permutations)]
    if name == "chi2":
        chi2 = PooledChi2(pooled)
        return np.array([chi2.statistic(o[:na]) for o in orders])
    lengths = prefix_lengths(pooled, draft)
    return np.array([lengths[o[na:]].mean() - lengths[o[:na]].mean() for o in orders])


def distribution_pvalues(samples_a, samples_b, draft, positions: int, permutations: int = PERMUTATIONS,
                         seed: int = 0) -> dict[str, float]:
    """Permutation p-value of each statistic: {"chi2": p, "prefix": p}."""
    a, b = token_matrix(samples_a, positions), token_matrix(samples_b, positions)
    d = token_matrix([draft], positions)[0]
    rng = np.random.default_rng(seed)
    return {name: permutation_pvalue(name, a, b, d, permutations, rng) for name in STATISTICS}


def permutation_pvalue(name: str, a: np.ndarray, b: np.ndarray, draft: np.ndarray, permutations: int,
                       rng: np.random.Generator) -> float:
    """Share of ``permutations`` relabellings whose statistic is at least the observed one (one added to each
    count, so p > 0)."""
    null = null_statistics(name, a, b, draft, permutations, rng)
    return float((np.sum(null >= statistic(name, a, b, draft)) + 1) / (permutations + 1))


def shifted(b: np.ndarray, draft: np.ndarray, share: float, rng: np.random.Generator) -> np.ndarray:
    """``b`` with ``share`` of its rows (chosen at random) replaced by ``draft``: requests that follow the draft."""
    out = b.copy()
    out[rng.choice(len(b), size=round(share * len(b)), replace=False)] = draft
    return out


def detection_power(name: str, a: np.ndarray, b: np.ndarray, draft: np.ndarray, share: float, critical: float,
                    trials: int, rng: np.random.Generator) -> float:
    """Share of ``trials`` in which the statistic of A against B with ``share`` shifted exceeds ``critical``."""
    return sum(statistic(name, a, shifted(b, draft, share, rng), draft) > critical for _ in range(trials)) / trials
