"""Patch ``cache_salt_scope``: a request's ``cache_salt``, hashed, reaches the worker that drafts, in the
freespec engines only, and a client cannot name another tenant's scope.

vLLM's real ``Request``, ``SamplingParams``, ``NewRequestData``, ``CachedRequestState`` and ``Scheduler`` class
(its ``add_request`` replaced by a recorder while a test runs); the worker side is ``request_ids.BatchRequestIds``
reading a stand-in runner's ``requests``, as the adapter does.
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from freespec.vllm_plugins import patches, probes, request_ids
from freespec.vllm_plugins.request_ids import SCOPE_ARG, SHARED_SCOPE, BatchRequestIds, scope_of


def engine_request(req_id: str, salt: str | None, extra_args: dict | None = None):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=4, extra_args=extra_args)
    return Request(request_id=req_id, prompt_token_ids=[1, 2, 3], sampling_params=params, pooling_params=None,
                   cache_salt=salt)


def scheduler(freespec: bool = True):
    spec = SimpleNamespace(method="custom_class" if freespec else "suffix")
    return SimpleNamespace(vllm_config=SimpleNamespace(
        speculative_config=spec, additional_config={"freespec": {"plugin": "hybrid"}} if freespec else {}))


def worker_state(request):
    """What the worker keeps of a request: the scheduler's NewRequestData, then the runner's CachedRequestState."""
    from vllm.v1.core.sched.output import NewRequestData
    from vllm.v1.worker.gpu_input_batch import CachedRequestState

    new = NewRequestData.from_request(request, ([0],))
    return CachedRequestState(req_id=new.req_id, prompt_token_ids=new.prompt_token_ids, mm_features=[],
                              sampling_params=new.sampling_params, generator=None, block_ids=new.block_ids,
                              num_computed_tokens=0, output_token_ids=[])


def read_scopes(states: dict, ids: list[str]):
    """The adapter's read: the runner found through the frame, then each id's scope."""
    import numpy as np

    tokens = np.zeros((len(ids), 4), dtype=np.int32)
    runner = SimpleNamespace(input_batch=SimpleNamespace(token_ids_cpu=tokens, req_ids=ids), requests=states)

    def propose_draft_token_ids(self):
        import sys

        return sys._getframe(0)

    frame = propose_draft_token_ids(runner)
    reader = BatchRequestIds()
    got = reader.read(frame, tokens, len(ids))
    return reader.scopes(got, len(ids))


def test_the_scope_is_a_hash_of_the_salt_and_the_shared_one_without():
    assert scope_of(None) == scope_of("") == SHARED_SCOPE
    a, b = scope_of("tenant-a"), scope_of("tenant-b")
    assert a != b and len(a) == 32 and "tenant" not in a and a == scope_of("tenant-a")


def test_the_salt_reaches_the_worker_hashed_through_vllms_own_classes():
    reqs = [engine_request("r1", "tenant-a"), engine_request("r2", None), engine_request("r3", "tenant-b")]
    s = scheduler()
    for r in reqs:
        assert patches.stamp_scope(s, r)
    states = {r.request_id: worker_state(r) for r in reqs}
    assert read_scopes(states, ["r3", "r1", "r2"]) == [scope_of("tenant-b"), scope_of("tenant-a"), SHARED_SCOPE]
    assert "tenant-a" not in repr(states["r1"].sampling_params)  # the salt itself stays in the engine core


def test_a_client_cannot_name_another_tenants_scope():
    forged = engine_request("r1", None, extra_args={SCOPE_ARG: scope_of("victim"), "other": 1})
    caller = forged.sampling_params.extra_args
    patches.stamp_scope(scheduler(), forged)
    assert forged.sampling_params.extra_args == {SCOPE_ARG: SHARED_SCOPE, "other": 1}
    assert caller[SCOPE_ARG] == scope_of("victim")  # a copy was written: the caller's dict is untouched


def test_a_stock_engine_is_left_alone():
    r = engine_request("r1", "tenant-a")
    assert not patches.stamp_scope(scheduler(freespec=False), r)
    assert r.sampling_params.extra_args is None


def test_without_the_patch_no_scope_is_read_and_rows_learn_nothing_across_requests(monkeypatch, caplog):
    r = engine_request("r1", None, extra_args={SCOPE_ARG: scope_of("victim")})  # never stamped: a client's value
    states = {"r1": worker_state(r)}
    monkeypatch.setenv("FREESPEC_DISABLE_PATCHES", "cache_salt_scope")
    with caplog.at_level(logging.WARNING, logger="freespec"):
        assert read_scopes(states, ["r1"]) == [None]
    assert "learn nothing across requests" in caplog.text
    monkeypatch.delenv("FREESPEC_DISABLE_PATCHES")
    monkeypatch.setattr(probes, "probe_cache_salt", lambda: probes.ProbeResult("cache_salt", False, "moved"))
    assert read_scopes(states, ["r1"]) == [None]


def test_a_request_the_patch_did_not_stamp_gets_no_scope():
    states = {"r1": worker_state(engine_request("r1", "tenant-a")),
              "r2": worker_state(engine_request("r2", None, extra_args={SCOPE_ARG: "not-a-scope"}))}
    assert read_scopes(states, ["r1", "r2"]) == [None, None]


@pytest.fixture
def vllm_add_request(monkeypatch):
    from vllm.v1.core.sched.scheduler import Scheduler

    added = []
    monkeypatch.setattr(Scheduler, "add_request", lambda self, request: added.append(request))
    return Scheduler, added


def test_the_wrapper_stamps_before_vllm_adds_and_installs_once(vllm_add_request):
    Scheduler, added = vllm_add_request
    assert patches.install_cache_salt_scope()
    wrapped = Scheduler.add_request
    assert patches.install_cache_salt_scope() and Scheduler.add_request is wrapped
    r = engine_request("r1", "tenant-a")
    wrapped(scheduler(), r)
    assert added == [r] and r.sampling_params.extra_args == {SCOPE_ARG: scope_of("tenant-a")}


def test_a_failing_stamp_still_adds_the_request_and_warns_once(vllm_add_request, monkeypatch, caplog):
    Scheduler, added = vllm_add_request
    patches.install_cache_salt_scope()

    def broken(scheduler, request):
        raise RuntimeError("moved")

    monkeypatch.setattr(patches.cache_salt_scope, "stamp_scope", broken)
    with caplog.at_level(logging.WARNING, logger="freespec"):
        for i in range(3):
            Scheduler.add_request(scheduler(), engine_request(f"r{i}", "a"))
    assert len(added) == 3
    assert caplog.text.count("patch cache_salt_scope failed") == 1


def test_nothing_is_installed_where_the_seam_moved(vllm_add_request, monkeypatch):
    Scheduler, _ = vllm_add_request
    monkeypatch.setattr(probes, "probe_cache_salt", lambda: probes.ProbeResult("cache_salt", False, "moved"))
    assert not patches.install_cache_salt_scope()
    assert not getattr(Scheduler.add_request, "_freespec", False)


def test_the_probe_holds_for_the_installed_vllm():
    assert probes.probe_cache_salt().ok
    assert "cache_salt_scope" in patches.patch_names()
    assert request_ids.valid_scope(scope_of("x")) and not request_ids.valid_scope("x" * 32)
