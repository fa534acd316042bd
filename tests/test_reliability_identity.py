"""Request identity (issue 19): with vLLM's request ids, two requests sharing a long prompt head never swap keys."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
from freespec.proposers.copy import CopyProposer
from freespec.vllm_plugins.request_tracker import HEAD_TOKENS, RequestTracker

from tests.adapter_helpers import adapter_for

HEAD = list(range(100, 100 + HEAD_TOKENS + 10))  # a shared system prompt longer than the fingerprint's head
A = np.asarray(HEAD + [1, 2, 3, 9, 7], dtype=np.int32)
B = np.asarray(HEAD + [4, 5, 6, 9, 7], dtype=np.int32)  # same length, same last token before this step


def test_without_ids_the_fingerprint_can_swap_two_requests():
    t = RequestTracker()
    ka, kb = t.update([(A[:-1], 1), (B[:-1], 1)])[0]
    keys, _ = t.update([(B, 1), (A, 1)])  # vLLM reordered the rows
    assert keys == [ka, kb]  # the fault: B's row got A's key (documented in docs/reliability.md)


def test_with_request_ids_keys_follow_the_request():
    t = RequestTracker()
    ka, kb = t.update([(A[:-1], 1), (B[:-1], 1)], ["a", "b"])[0]
    keys, departed = t.update([(B, 1), (A, 1)], ["b", "a"])
    assert keys == [kb, ka] and departed == []
    keys, departed = t.update([(A[:3], 3)], ["b"])  # the id now names another sequence: a new key
    assert keys[0] not in (ka, kb) and sorted(departed) == sorted([ka, kb])


class Recording(CopyProposer):
    """Copy, recording which key it saw for which row."""

    seen: list = []

    def draft(self, rows, step):
        type(self).seen.append([(row.key, int(row.tokens[HEAD_TOKENS + 10])) for row in rows])
        return super().draft(rows, step)


class FakeRunner:
    """What vLLM's model runner holds: the input batch with token rows and request ids in the same order."""

    def __init__(self, adapter, width=200):
        self.adapter = adapter
        self.input_batch = SimpleNamespace(token_ids_cpu=np.zeros((2, width), np.int32), req_ids=[])

    def propose_draft_token_ids(self, seqs, ids):
        batch = self.input_batch
        for i, s in enumerate(seqs):
            batch.token_ids_cpu[i, : len(s)] = s
        batch.req_ids = list(ids)
        lengths = np.asarray([len(s) for s in seqs], np.int32)
        return self.adapter.propose([[int(s[-1])] for s in seqs], lengths, batch.token_ids_cpu)


def make_adapter():
    return adapter_for({"plugin": "test_reliability_identity:Recording", "num_speculative_tokens": 4})


def test_the_adapter_keys_rows_by_vllms_request_ids(caplog):
    Recording.seen = []
    adapter = make_adapter()
    runner = FakeRunner(adapter)
    with caplog.at_level(logging.WARNING, logger="freespec"):
        runner.propose_draft_token_ids([A[:-1], B[:-1]], ["req-a", "req-b"])
        runner.propose_draft_token_ids([B, A], ["req-b", "req-a"])
    first, second = Recording.seen
    key_of = dict((tok, key) for key, tok in first)
    assert all(key_of[tok] == key for key, tok in second)  # each request kept its own key
    assert adapter.request_ids._batch is runner.input_batch and "request ids cannot be read" not in caplog.text


def test_without_a_runner_the_adapter_falls_back_with_one_warning(caplog):
    adapter = make_adapter()
    tokens = np.zeros((1, 100), np.int32)
    with caplog.at_level(logging.WARNING, logger="freespec"):
        for n in (50, 51, 52):
            adapter.propose([[0]], np.asarray([n], np.int32), tokens)
    assert caplog.text.count("request ids cannot be read here") == 1


# ---------------------------------------------------------------- the request_ids probe (vllm_plugins/probes.py)
RUNNER_SOURCE = """
        elif spec_config.method == "custom_class":
            draft_token_ids = cast(Any, self.drafter).propose(
                sampled_token_ids,
                self.input_batch.num_tokens_no_spec,
                self.input_batch.token_ids_cpu,
                slot_mappings=slot_mappings,
            )
"""


class InputBatch:
    req_ids: list = []


def test_the_request_ids_probe_passes_on_vllms_call_and_names_what_moved():
    from freespec.vllm_plugins.probes import request_ids_problem

    assert request_ids_problem(RUNNER_SOURCE, InputBatch) is None
    moved = RUNNER_SOURCE.replace("self.input_batch.token_ids_cpu", "token_ids")
    assert "token_ids_cpu" in request_ids_problem(moved, InputBatch)
    assert "req_ids" in request_ids_problem(RUNNER_SOURCE, object)
    assert "custom_class" in request_ids_problem("", InputBatch)
