"""Choose one linear draft chain from a tree of candidates, and learn how often candidates are accepted.

vLLM 0.32 verifies one linear chain per request, so a tree of candidates (for
instance token recycling's walk through its adjacency matrix) has to be cut
down to one root-to-node path. Each edge of the tree carries an estimate
``p`` that the target accepts that token given that everything before it on the
path was accepted. Drafting the path to node ``n`` then yields, in expectation,
``sum over the path's nodes of P(path up to that node accepted)`` tokens, and
verifying each drafted token costs ``min_token_gain`` tokens' worth of work.
The chosen chain is the path whose expected gain minus cost is largest; the
empty chain (value 0) wins when nothing pays. Unlike the plain top-1 chain, this
can take a second-ranked token whose continuation the target is sure about.

``EdgeAcceptance`` supplies ``p``: a Beta-posterior estimate per (candidate
rank, bucket of the probability the target gave that candidate when it was
recorded), learned online from what vLLM accepts. Its prior mean is the
bucket's recorded probability, so it starts from the target's own confidence
and corrects it with what is actually accepted (the recorded probability is
stale: it was the target's view in another context).
"""
from __future__ import annotations

import numpy as np

from freespec.scorers.acceptance import AcceptanceCounts
from freespec.scorers.tuning import CHAIN_PRIOR_STRENGTH, CHAIN_PROB_EDGES, CHAIN_WINDOW

# The buckets' upper edges (the last bucket runs to 1) in the recorded probabilities' float32.
_EDGES = np.array(CHAIN_PROB_EDGES, dtype=np.float32)


def _bucket_centres() -> np.ndarray:
    lows = np.concatenate([[0.0], _EDGES])
    highs = np.concatenate([_EDGES, [1.0]])
    return ((lows + highs) / 2).astype(np.float64)


class EdgeAcceptance:
    """P(a candidate is accepted | its rank, the probability recorded with it), learned online: a cell of
    ``AcceptanceCounts`` per (rank, bucket), its prior mean the bucket's centre."""

    def __init__(self, ranks: int) -> None:
        centres = np.broadcast_to(_bucket_centres(), (ranks, len(_EDGES) + 1))
        self.counts = AcceptanceCounts(centres * CHAIN_PRIOR_STRENGTH, (1.0 - centres) * CHAIN_PRIOR_STRENGTH,
                                       CHAIN_WINDOW)

    @staticmethod
    def cells(ranks: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(ranks, dtype=np.int64), np.searchsorted(_EDGES, probs, side="right")

    def estimate(self, ranks: np.ndarray, probs: np.ndarray) -> np.ndarray:
        r, b = self.cells(ranks, probs)
        s, f = self.counts.successes[r, b], self.counts.failures[r, b]
        return s / (s + f)

    def observe(self, ranks: np.ndarray, buckets: np.ndarray, accepted: int) -> None:
        """A chain with these edges (in order) was verified and its first ``accepted`` tokens were kept."""
        self.counts.observe(list(zip(np.asarray(ranks).tolist(), np.asarray(buckets).tolist())), accepted)


def best_chains(
    tokens: np.ndarray,
    p_edge: np.ndarray,
    parents: np.ndarray,
    depths: np.ndarray,
    min_token_gain: float,
    max_len: int,
) -> list[np.ndarray]:
    """Per tree (row), the node indices of the best root-to-node path (possibly empty).

    ``tokens``/``p_edge`` are [B, N] over a static tree whose node ``n`` hangs
    under ``parents[n]`` (-1: under the root) at depth ``depths[n]``, parents
    before children. Nodes with token -1 and nodes deeper than ``max_len`` are
    never chosen.
    """
    b, n = tokens.shape
    if b == 0 or n == 0 or max_len <= 0:
        return [np.zeros(0, dtype=np.int64) for _ in range(b)]
    path_p = np.empty((b, n), dtype=np.float64)
    value = np.empty((b, n), dtype=np.float64)
    usable = (tokens >= 0) & (depths < max_len)[None, :]
    for level in range(int(depths.max()) + 1):
        nodes = np.flatnonzero(depths == level)
        par = parents[nodes]
        if level == 0:
            parent_p, parent_v, parent_ok = 1.0, 0.0, True
        else:
            parent_p, parent_v, parent_ok = path_p[:, par], value[:, par], usable[:, par]
        usable[:, nodes] &= parent_ok
        path_p[:, nodes] = parent_p * p_edge[:, nodes]
        value[:, nodes] = parent_v + path_p[:, nodes] - min_token_gain
    value[~usable] = -np.inf
    best = np.argmax(value, axis=1)
    chains = []
    for row, node in enumerate(best):
        if not value[row, node] > 0.0:
            chains.append(np.zeros(0, dtype=np.int64))
            continue
        path = []
        while node >= 0:
            path.append(node)
            node = parents[node]
        chains.append(np.asarray(path[::-1], dtype=np.int64))
    return chains
