"""Acceptance estimates, and the draft length the policy keeps of chances alpha**i."""
import numpy as np
import pytest

from freespec.scorers.acceptance import AcceptanceEstimate, matched_prefix
from freespec.scorers.policy import paying_prefix


def test_estimate_converges_to_per_token_acceptance():
    est = AcceptanceEstimate()
    for _ in range(500):
        est.observe(drafted=4, accepted=3)  # 3 accepted, then one rejection
    assert est.alpha == pytest.approx(0.75, abs=0.01)


def test_fully_accepted_drafts_count_no_failure():
    est = AcceptanceEstimate()
    est.observe(drafted=5, accepted=5)
    assert est.failures == 1.0 and est.successes == 6.0


@pytest.mark.parametrize(
    "alpha, gain, k, want",
    [(0.9, 0.2, 8, 8), (0.5, 0.2, 8, 2), (0.5, 0.5, 8, 1), (0.1, 0.2, 8, 0), (1.0, 0.5, 3, 3), (0.9, 0.0, 5, 5)],
)
def test_draft_length(alpha, gain, k, want):
    # copy's draft of k tokens offered at chances alpha, alpha**2, ...: the policy keeps the paying ones
    assert paying_prefix([alpha ** (i + 1) for i in range(k)], gain) == want


def test_matched_prefix():
    assert matched_prefix([1, 2, 3], [1, 2, 9, 4]) == (2, 3)
    assert matched_prefix(np.array([1, 2, 3]), np.array([1, 2, 9, 4])) == (2, 3)
    assert matched_prefix(np.array([1, 2, 3]), np.array([1])) == (1, 1)
    assert matched_prefix(np.array([1, 2]), np.array([], dtype=np.int64)) == (0, 0)
