"""The correction of draft chances by what the target accepted (scorers/calibration.py) and its use in hybrid."""
import numpy as np
import pytest
from freespec.proposers.base import EngineInfo, Row
from freespec.proposers.hybrid import HybridOptions, HybridProposer
from freespec.scorers import calibration as cal
from freespec.scorers.calibration import ChanceCalibration
from freespec.scorers.fusion import Candidates, SourceWeights, fuse_sources


def test_starts_at_one_and_stays_there_when_the_chances_hold():
    c = ChanceCalibration()
    assert c.factor == 1.0
    for _ in range(500):  # chances 1, 0.5: 1.5 expected; alternately 1 and 2 right (1.5 on average)
        c.observe([1.0, 0.5], 1, 2)
        c.observe([1.0, 0.5], 2, 2)
    assert c.factor == pytest.approx(1.0, abs=0.02)


def test_optimistic_chances_are_scaled_down_and_stay_ordered():
    c = ChanceCalibration()
    for _ in range(2000):  # 2 expected, 1 accepted on average
        c.observe([1.0, 0.6, 0.4], 0, 3)
        c.observe([1.0, 0.6, 0.4], 2, 3)  # all three judged: the third was wrong after two right
    assert c.factor == pytest.approx(0.5, abs=0.02)
    assert c.scale([0.9, 0.6, 0.2]) == pytest.approx([0.45, 0.3, 0.1], abs=0.01)


def test_tokens_past_the_output_are_not_judged():
    c = ChanceCalibration(expected=0.0, accepted=0.0)
    c.observe([0.9, 0.8, 0.7, 0.6], 2, 2)  # both compared tokens right: the other two not judged yet
    assert c.expected == pytest.approx(1.7) and c.accepted == 2
    c = ChanceCalibration(expected=0.0, accepted=0.0)
    c.observe([0.9, 0.8, 0.7, 0.6], 1, 2)  # the second was wrong: none after it can be accepted
    assert c.expected == pytest.approx(3.0) and c.accepted == 1
    c.observe([0.9], 0, 0)  # nothing compared: no evidence
    c.observe([], 0, 3)
    assert c.expected == pytest.approx(3.0)


def test_the_factor_stays_in_its_range():
    never = ChanceCalibration()
    always = ChanceCalibration()
    for _ in range(3000):
        never.observe([0.9, 0.8], 0, 2)
        always.observe([0.1, 0.01], 2, 2)
    assert never.factor == cal.LOWEST and always.factor == cal.HIGHEST
    assert always.scale([0.9, 0.5]) == pytest.approx([1.0, 0.75])  # at most 1


def test_the_bar_cuts_on_corrected_chances():
    sure = Candidates("suffix", np.array([[1, 2, 3, 4]]), np.ones(1), token_probs=np.array([[0.9, 0.8, 0.5, 0.1]]))
    assert fuse_sources({"suffix": sure}, SourceWeights(), 4, 0.05, 0.3).tokens == [1, 2, 3]  # 0.36 >= 0.3
    halved = fuse_sources({"suffix": sure}, SourceWeights(), 4, 0.05, 0.3, calibration=0.5)
    assert halved.tokens == [1, 2]  # 0.36 * 0.5 < 0.3
    assert halved.chances == pytest.approx([0.9, 0.72])  # handed on uncorrected


def make_copy_hybrid():
    p = HybridProposer(HybridOptions(sources=("copy",)), 4)
    p.bind(EngineInfo(vocab_size=100))
    return p


TEXT = [5, 6, 7, 8, 9, 10, 11, 5, 6, 7]  # copy drafts 8, 9, ... from here


def test_hybrid_learns_its_factor_from_the_target_s_output():
    p = make_copy_hybrid()
    p.weights.weight = lambda name: 0.9  # a source sure of itself whatever its outcomes, so only the factor learns
    for i in range(400):  # the target always says 50 instead
        p.propose([Row(i, np.asarray(TEXT, np.int32), 1)])
        p.propose([Row(i, np.asarray(TEXT + [50], np.int32), 1)])
        p.release(i)
    assert p.calibration.factor < 0.5


def test_hybrid_hands_on_corrected_chances_and_learns_from_uncorrected_ones():
    p = make_copy_hybrid()
    p.calibration = ChanceCalibration(expected=2.0, accepted=1.0)  # factor 0.5
    draft = p.propose([Row(0, np.asarray(TEXT, np.int32), 1)])[0]
    raw = p._offered[0][4]
    assert len(draft) == len(raw) > 0
    assert p.draft_chances()[0] == pytest.approx([c * 0.5 for c in raw])
    p.propose([Row(0, np.asarray(TEXT + [50], np.int32), 1)])  # the first token was wrong: all judged
    assert p.calibration.expected == pytest.approx(2.0 * cal.KEEP + sum(raw))
