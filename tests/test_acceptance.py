"""Acceptance estimates, and the draft length the policy keeps of chances alpha**i."""
import numpy as np
import pytest

from freespec.scorers.acceptance import AcceptanceCounts, AcceptanceEstimate, matched_prefix
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


def test_counts_take_successes_up_to_the_first_rejection_and_one_failure():
    counts = AcceptanceCounts([1.0] * 4, [1.0] * 4)
    counts.observe([0, 1, 2, 3], accepted=2)  # cells 0, 1 right, 2 wrong, 3 never verified
    assert counts.successes == [2.0, 2.0, 1.0, 1.0] and counts.failures == [1.0, 1.0, 2.0, 1.0]
    counts.observe([3, 3], accepted=1, compared=1)  # the second token could not be compared
    assert counts.successes[3] == 2.0 and counts.failures[3] == 1.0


def test_a_cell_past_its_window_is_halved_and_only_that_cell():
    counts = AcceptanceCounts([1.0, 1.0], [1.0, 1.0], window=10.0)
    for _ in range(8):
        counts.observe([0], accepted=1)  # 9 successes + 1 failure: at the window, kept
    assert counts.successes[0] == 9.0
    counts.observe([0, 1], accepted=1)  # cell 0 passes it: halved; cell 1 gets its failure, unhalved
    assert (counts.successes[0], counts.failures[0]) == (5.0, 0.5)
    assert (counts.successes[1], counts.failures[1]) == (1.0, 2.0)
    assert counts.mean(0) == pytest.approx(5.0 / 5.5)


def test_counts_in_a_numpy_table_are_indexed_by_tuples():
    counts = AcceptanceCounts(np.ones((2, 3)), np.ones((2, 3)), window=3.0)
    counts.observe([(0, 1), (1, 2)], accepted=1)
    assert counts.successes[0, 1] == 2.0 and counts.failures[1, 2] == 2.0
    counts.observe([(0, 1)], accepted=1)  # 3 + 1 > 3: halved
    assert counts.successes[0, 1] == 1.5 and counts.failures[0, 1] == 0.5


def test_an_estimate_is_halved_past_its_window():
    est = AcceptanceEstimate(window=100.0)
    for _ in range(25):
        est.observe(drafted=4, accepted=3)
    assert est.successes + est.failures <= 100.0
    assert est.alpha == pytest.approx(0.75, abs=0.02)


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
