"""Request identity inferred from token rows (no vLLM)."""
import numpy as np

from freespec.vllm_plugins.request_tracker import RequestTracker


def seq(seed, n):
    return np.random.default_rng(seed).integers(0, 1000, size=n).astype(np.int32)


def test_keys_survive_row_reordering_and_growth():
    a, b = seq(1, 300), seq(2, 300)
    t = RequestTracker()
    keys, gone = t.update([(a[:100], 1), (b[:50], 1)])
    assert gone == [] and keys[0] != keys[1]
    keys2, gone = t.update([(b[:53], 3), (a[:101], 1)])  # reordered, b accepted 2 drafts
    assert keys2 == [keys[1], keys[0]] and gone == []


def test_departed_requests_are_reported_once():
    a, b = seq(1, 300), seq(2, 300)
    t = RequestTracker()
    keys, _ = t.update([(a[:100], 1), (b[:50], 1)])
    _, gone = t.update([(a[:101], 1)])
    assert gone == [keys[1]]
    _, gone = t.update([(a[:102], 1)])
    assert gone == []


def test_partial_prefill_rows_keep_their_key():
    a = seq(3, 200)
    t = RequestTracker()
    k1, _ = t.update([(a[:150], 0)])  # chunked prefill: nothing sampled yet
    k2, _ = t.update([(a[:150], 0)])
    k3, _ = t.update([(a[:151], 1)])  # prefill done, first token
    assert k1 == k2 == k3


def test_same_prompt_requests_get_distinct_keys():
    p = seq(4, 80)
    a = np.append(p, 5).astype(np.int32)
    b = np.append(p, 6).astype(np.int32)
    t = RequestTracker()
    keys, _ = t.update([(a, 1), (b, 1)])
    assert len(set(keys)) == 2
    keys2, _ = t.update([(np.append(b, 7), 1), (np.append(a, 8), 1)])
    assert keys2 == [keys[1], keys[0]]


def test_a_row_with_unexpected_length_is_a_new_request():
    a = seq(5, 300)
    t = RequestTracker()
    (k1,), _ = t.update([(a[:100], 1)])
    (k2,), gone = t.update([(a[:110], 1)])  # 10 new tokens but only 1 reported: not the same request
    assert k2 != k1 and gone == [k1]


def test_request_ids_are_read_from_the_callers_batch_unless_the_patch_is_disabled(monkeypatch):
    import sys
    from types import SimpleNamespace

    from freespec.vllm_plugins.request_ids import BatchRequestIds

    tokens = np.zeros((2, 4), dtype=np.int32)

    class Runner:  # stands in for vLLM's model runner calling the seam's propose()
        input_batch = SimpleNamespace(token_ids_cpu=tokens, req_ids=["a", "b"])

        def propose(self, reader):
            return reader.read(sys._getframe(0), tokens, 2)

    monkeypatch.delenv("FREESPEC_DISABLE_PATCHES", raising=False)
    assert Runner().propose(BatchRequestIds()) == ["a", "b"]
    monkeypatch.setenv("FREESPEC_DISABLE_PATCHES", "request_ids")
    assert Runner().propose(BatchRequestIds()) is None
