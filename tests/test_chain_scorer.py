"""Choosing one chain from a candidate tree (freespec.scorers.chain)."""
import numpy as np

from freespec.scorers.chain import EdgeAcceptance, best_chains

# Tree: root -> A(0) B(1); A -> C(2); B -> D(3); D -> E(4)
PARENTS = np.array([-1, -1, 0, 1, 3])
DEPTHS = np.array([0, 0, 1, 1, 2])


def test_prefers_the_path_with_more_expected_tokens_even_through_a_second_rank():
    tokens = np.array([[10, 11, 12, 13, 14]])
    # A is likelier than B, but after A nothing is likely, while B's continuation is near certain.
    p = np.array([[0.6, 0.5, 0.05, 0.95, 0.95]])
    (chain,) = best_chains(tokens, p, PARENTS, DEPTHS, min_token_gain=0.1, max_len=8)
    assert list(chain) == [1, 3, 4]  # 0.5 + 0.475 + 0.45 beats 0.6 (+ 0.03)


def test_cuts_where_one_more_token_does_not_pay_and_respects_max_len():
    tokens = np.array([[10, 11, 12, 13, 14]])
    p = np.array([[0.9, 0.1, 0.1, 0.1, 0.1]])
    (chain,) = best_chains(tokens, p, PARENTS, DEPTHS, min_token_gain=0.2, max_len=8)
    assert list(chain) == [0]  # C would add 0.09 expected tokens for 0.2 of cost
    p = np.array([[0.2, 0.5, 0.05, 0.95, 0.95]])
    (chain,) = best_chains(tokens, p, PARENTS, DEPTHS, min_token_gain=0.1, max_len=2)
    assert list(chain) == [1, 3]


def test_empty_when_nothing_pays_or_nothing_is_known():
    tokens = np.array([[10, 11, 12, 13, 14], [-1, -1, -1, -1, -1], [-1, 11, 12, 13, 14]])
    p = np.array([[0.05] * 5, [0.9] * 5, [0.9, 0.5, 0.9, 0.9, 0.9]])
    chains = best_chains(tokens, p, PARENTS, DEPTHS, min_token_gain=0.1, max_len=8)
    assert [list(c) for c in chains] == [[], [], [1, 3, 4]]  # a -1 node is never chosen nor passed through


def test_no_rows():
    assert best_chains(np.zeros((0, 5), int), np.zeros((0, 5)), PARENTS, DEPTHS, 0.1, 8) == []


def test_edge_acceptance_starts_at_recorded_probability_and_learns():
    est = EdgeAcceptance(ranks=4)
    low, high = est.estimate(np.array([0, 0]), np.array([0.03, 0.97]))
    assert low < 0.1 < 0.9 < high
    ranks = np.array([0, 0, 0])
    _, buckets = est.cells(ranks, np.array([0.03, 0.03, 0.03]))
    for _ in range(50):
        est.observe(ranks, buckets, accepted=3)  # low-probability candidates that are always accepted
    assert est.estimate(np.array([0]), np.array([0.03]))[0] > 0.8
    assert est.estimate(np.array([1]), np.array([0.03]))[0] < 0.1  # other ranks untouched
    est.observe(ranks, buckets, accepted=0)
    assert est.counts.failures[0, buckets[0]] > est.counts.failures[1, buckets[0]]
