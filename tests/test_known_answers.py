"""KnownAnswers and Follow: earlier answers found by how their prompt ended, bounded, per scope."""
import numpy as np

from freespec.proposers.learned.known_answers import PER_KEY, Follow, KnownAnswers


def seq(*tokens):
    return np.array(tokens, dtype=np.int32)


def test_an_answer_is_found_by_its_first_tokens_in_its_own_scope_only():
    known = KnownAnswers(key_tokens=2, max_answers=10, max_tokens=100)
    known.add("a", seq(1, 2, 3, 4))
    known.add("a", seq(1, 2, 5))
    known.add("a", seq(1))  # no longer than its key: nothing to follow
    assert [x.tolist() for x in known.find("a", seq(1, 2, 9))] == [[1, 2, 5], [1, 2, 3, 4]]  # newest first
    assert known.find("b", seq(1, 2)) == [] and known.find("a", seq(1)) == []
    known.forget("a")
    assert known.find("a", seq(1, 2)) == [] and known.tokens == 0


def test_the_oldest_answers_go_first_beyond_either_bound_and_a_key_keeps_its_newest():
    known = KnownAnswers(key_tokens=1, max_answers=3, max_tokens=10)
    for first in range(4):
        known.add("a", seq(first, 0, 0))
    assert known.find("a", seq(0)) == [] and known.tokens == 9  # three answers of 3 tokens
    known.add("a", seq(7, 0, 0, 0, 0))  # 14 tokens: the two oldest go
    assert known.tokens == 8 and known.find("a", seq(1)) == [] and len(known.find("a", seq(3))) == 1
    for _ in range(PER_KEY + 2):
        known.add("b", seq(5, 1))
    assert len(known.find("b", seq(5))) == min(PER_KEY, 3)
    known.add("a", np.arange(11, dtype=np.int32))  # longer than max_tokens alone: not kept
    assert known.find("a", seq(0)) == []


def test_follow_keeps_the_answers_the_request_still_repeats():
    follow = Follow([seq(1, 2, 3, 4, 5), seq(1, 2, 9, 9)])
    follow.advance(seq(1, 2))
    assert follow.ahead(2).tolist() == [3, 4]  # the newest still followed
    follow.advance(seq(1, 2, 9))
    assert follow.ahead(8).tolist() == [9] and len(follow.candidates) == 1
    follow.advance(seq(1, 2, 9, 9))
    assert follow.ahead(8) is None  # it ended here
    follow.advance(seq(1, 2, 9, 9, 1))
    assert follow.candidates == []
