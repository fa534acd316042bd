"""The suffix source's learning across restarts and replicas (responses_path, merge_from)."""
from __future__ import annotations

import time

import numpy as np
import pytest
from pydantic import ValidationError

from freespec.proposers.base import EngineInfo, Row
from freespec.proposers import suffix_tree
from freespec.proposers.suffix_tree import SuffixOptions, SuffixTreeProposer, available, with_prompt_tail

pytestmark = pytest.mark.skipif(not available()[0], reason="needs arctic-inference")

INFO = EngineInfo(vocab_size=1000, model="m", tokenizer_fingerprint=lambda: "sha256:tok-a")
PROMPT = np.arange(10, 20, dtype=np.int32)
ANSWER = np.arange(500, 512, dtype=np.int32)


def serve(proposer: SuffixTreeProposer, key: int, prompt: np.ndarray, output: np.ndarray) -> None:
    """Feed one request through the source as the engine does (the first step after the prefill brings the
    prompt and one sampled token, then one token a step), then let it leave."""
    seq = prompt
    for token in output:
        seq = np.append(seq, token).astype(np.int32)
        proposer.candidates([Row(key=key, tokens=seq, num_new=1)])
    proposer.release(key)


def learned(answer: np.ndarray, prompt: np.ndarray = PROMPT) -> list[int]:
    """What a response is kept as: the prompt's last ``prompt_tail`` tokens, then the answer."""
    return with_prompt_tail(prompt, answer, SuffixOptions().prompt_tail)


def first_draft(proposer: SuffixTreeProposer, context: np.ndarray) -> list[int]:
    found = proposer.candidates([Row(key=99, tokens=context, num_new=len(context))])[0]
    return [] if found is None else [int(t) for t in found.chains[0] if t >= 0]


def started(path, info=INFO, **options) -> SuffixTreeProposer:
    proposer = SuffixTreeProposer(SuffixOptions(responses_path=str(path), **options), 8)
    proposer.bind(info)
    return proposer


def test_a_restarted_source_drafts_from_the_responses_saved_before(tmp_path):
    path = tmp_path / "responses.bin"
    first = started(path)
    serve(first, 1, PROMPT, ANSWER)
    first.close()
    assert path.exists()
    context = np.array([1, 2, 3, 500, 501, 502], dtype=np.int32)  # a new prompt that quotes the old answer
    cold = SuffixTreeProposer(SuffixOptions(), 8)
    cold.bind(INFO)
    assert first_draft(cold, context) == []
    warm = started(path)
    assert first_draft(warm, context)[:3] == [503, 504, 505]


def test_a_file_of_another_tokenizer_is_refused_at_start_naming_the_option(tmp_path):
    path = tmp_path / "responses.bin"
    first = started(path)
    serve(first, 1, PROMPT, ANSWER)
    first.close()
    other = EngineInfo(vocab_size=1000, model="m", tokenizer_fingerprint=lambda: "sha256:tok-b")
    with pytest.raises(ValueError, match="responses_path"):
        started(path, info=other)


def test_a_corrupt_file_is_refused_at_start(tmp_path):
    path = tmp_path / "responses.bin"
    path.write_bytes(b"not a response store at all" * 10)
    with pytest.raises(ValueError, match="responses_path"):
        started(path)


def test_merge_from_needs_responses_path():
    with pytest.raises(ValidationError, match="merge_from needs responses_path"):
        SuffixOptions(merge_from=("/tmp/peer.bin",))


def test_a_replica_merges_the_others_file_at_start(tmp_path):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    replica_a = started(a)
    serve(replica_a, 1, PROMPT, ANSWER)
    replica_a.close()
    replica_b = started(b, merge_from=(str(a),))
    context = np.array([7, 500, 501, 502], dtype=np.int32)
    assert first_draft(replica_b, context)[:2] == [503, 504]


def test_the_saved_store_keeps_only_the_newest_responses_within_its_bounds(tmp_path):
    path = tmp_path / "responses.bin"
    source = started(path, max_saved_responses=2)
    answers = [np.arange(100 * i, 100 * i + 12, dtype=np.int32) for i in range(1, 5)]
    for key, answer in enumerate(answers, start=1):
        serve(source, key, PROMPT, answer)
    source.close()
    assert [list(r) for r in source.store.responses()] == [learned(a) for a in answers[-2:]]
    reloaded = started(path, max_saved_responses=2)
    assert len(reloaded.store) == 2


def test_requests_still_live_at_shutdown_are_saved_too(tmp_path):
    """The engine reports a request's departure only at the next step; the last ones are kept at close."""
    path = tmp_path / "responses.bin"
    source = started(path)
    seq = PROMPT
    for token in ANSWER:
        seq = np.append(seq, token).astype(np.int32)
        source.candidates([Row(key=5, tokens=seq, num_new=1)])
    source.close()  # no release(5): the engine stopped first
    warm = started(path)
    assert [list(r) for r in warm.store.responses()] == [learned(ANSWER)]


def test_an_idle_engine_keeps_and_saves_the_requests_it_was_not_told_had_left(tmp_path):
    """vLLM reports a request's departure only at the next step, which an idle engine never takes: idle()
    keeps the live requests' outputs once a save is due and saves them; the release that comes with the next
    step adds nothing again, and what a request answers after idle() is stored apart."""
    path = tmp_path / "responses.bin"
    source = started(path, save_every_s=0.5)
    seq = PROMPT
    for token in ANSWER:
        seq = np.append(seq, token).astype(np.int32)
        source.candidates([Row(key=5, tokens=seq, num_new=1)])
    source.idle()  # no save due yet (the last came within save_every_s): nothing kept
    assert len(source.store) == 0
    time.sleep(0.55)
    source.idle()
    assert source.store.wait_files(10)
    assert [list(r) for r in started(path).store.responses()] == [learned(ANSWER)]
    more = np.arange(600, 604, dtype=np.int32)
    for token in more:  # the request went on after all (a step longer than the idle time)
        seq = np.append(seq, token).astype(np.int32)
        source.candidates([Row(key=5, tokens=seq, num_new=1)])
    source.release(5)
    source.close()
    assert [list(r) for r in started(path).store.responses()] == [learned(ANSWER), list(more)]


def test_idle_without_a_file_or_with_periodic_saves_off_keeps_nothing(tmp_path):
    plain = SuffixTreeProposer(SuffixOptions(), 8)
    plain.bind(INFO)
    plain.idle()  # no store: nothing to do, nothing raised
    path = tmp_path / "responses.bin"
    source = started(path, save_every_s=0)  # saves only at start and exit
    source.candidates([Row(key=5, tokens=np.append(PROMPT, ANSWER[:3]).astype(np.int32), num_new=3)])
    time.sleep(0.01)
    source.idle()
    assert len(source.store) == 0 and not path.exists()


def test_an_idle_replica_merges_a_peers_new_responses_a_step_at_a_time_saying_while_more_wait(tmp_path, monkeypatch):
    monkeypatch.setattr(suffix_tree, "SEED_TOKENS_PER_STEP", 32 * 14)  # 32 a call (prompt and answer: 14 tokens)
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    replica_b = started(b, merge_from=(str(a),), save_every_s=0.5)
    replica_a = started(a)
    for key in range(100):
        serve(replica_a, key, PROMPT, np.array([500 + key, 7, 8, 9], dtype=np.int32))
    replica_a.close()
    time.sleep(0.55)
    assert replica_b.idle() is False  # the save tick asks the background thread for the peer's file
    assert replica_b.store.wait_files(10) is False  # read, checked and merged: it waits to be taken
    said = [replica_b.idle() for _ in range(5)]
    assert said == [True, True, True, False, False]  # 100 responses, 32 a call
    assert replica_b._seeded == 100
    assert first_draft(replica_b, np.array([1, 2, 599, 7], dtype=np.int32))[:2] == [8, 9]


def test_merged_responses_go_into_the_tree_within_a_token_budget_a_step_and_a_long_one_alone(tmp_path, monkeypatch):
    # 32 responses of 200 tokens a step cost the engine's thread 10 ms on Zen 3; the budget is in tokens
    monkeypatch.setattr(suffix_tree, "SEED_TOKENS_PER_STEP", 100)
    source = started(tmp_path / "responses.bin", save_every_s=0)
    lengths = [40, 40, 40, 300, 10, 90]
    source._to_seed.extend(("", np.arange(n, dtype=np.int32) % 900) for n in lengths)
    seeded = []
    for _ in range(5):
        before = source._seeded
        source._files_tick()
        seeded.append(source._seeded - before)
    assert seeded == [2, 1, 1, 2, 0]  # 40+40; 40 (300 would pass 100); 300 alone; 10+90; nothing left
