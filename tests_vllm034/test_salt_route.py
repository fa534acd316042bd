"""Patch ``v2_salt_route``: a request's ``cache_salt`` scope reaches a Model Runner V2 speculator by slot.

Driven through vLLM 0.34's own code as far as a CPU allows: its ``Request`` (with ``cache_salt``), its
``Scheduler.add_request`` (the stamp runs before it), ``NewRequestData.from_request`` (what the worker is sent)
and ``GPUModelRunner.add_requests`` (which gives the request its slot and calls the speculator's
``add_request``; the route runs after it), on a runner whose parts vLLM builds on a GPU stood in for. The
speculator is freespec's own, drafting with ``copy``, whose pool of departed outputs is kept per scope.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from test_speculators import K, HistoryState, v2_parts

vllm = pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]
ANSWER = list(range(900, 940))  # an output no prompt holds


class RunnerState(HistoryState):
    """The request state with the signature ``GPUModelRunner.add_requests`` calls (vLLM's needs CUDA)."""

    def add_request(self, req_id, prompt_len, all_token_ids, num_computed_tokens, max_tokens):  # noqa: ARG002
        return super().add_request(req_id, list(all_token_ids))

    def apply_staged_writes(self) -> None:
        return None


@pytest.fixture
def route(monkeypatch):
    """Patch ``v2_salt_route`` installed, vLLM's classes restored afterwards."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    from freespec.vllm_plugins.patches import v2_salt_route

    monkeypatch.setattr(Scheduler, "add_request", Scheduler.add_request)  # restored after the test
    monkeypatch.setattr(GPUModelRunner, "add_requests", GPUModelRunner.add_requests)
    assert v2_salt_route.install_v2_salt_route()
    assert v2_salt_route.route_installed()
    return v2_salt_route


class Engine:
    """vLLM 0.34's scheduler and runner methods on stand-in parts, with freespec's speculator."""

    def __init__(self, options=None) -> None:
        from freespec.vllm_plugins.v2.speculator import FreespecSpeculator

        config, _ = v2_parts("freespec_copy", options)
        self.states = RunnerState(4, 2048)
        self.speculator = FreespecSpeculator(config, torch.device("cpu"), req_states=self.states)
        self.scheduler = SimpleNamespace(
            requests={}, connector=None, spec_decode_metrics_level="none", num_spec_tokens=K, log_stats=False,
            vllm_config=SimpleNamespace(speculative_config=config.speculative_config, additional_config=None),
            _enqueue_waiting_request=lambda request: None)
        noop = SimpleNamespace(add_request=lambda *a: None, apply_staged_writes=lambda: None,
                               append_block_ids=lambda *a, **k: None)
        self.runner = SimpleNamespace(
            req_states=self.states, speculator=self.speculator, adaptive_verification=None, pooling_runner=None,
            encoder_cache=None, model_state=noop, block_tables=noop, lora_state=noop, is_last_pp_rank=False,
            sampler=None,
            _remove_request=lambda req_id: req_id in self.states.req_id_to_index and self.states.remove_request(req_id))
        self.sent = {}  # req_id -> the NewRequestData the worker got

    def add(self, req_id: str, prompt: list[int], salt: str | None = None, extra_args=None) -> int:
        """One request through vLLM's add_request, NewRequestData.from_request and add_requests; its slot."""
        from vllm import SamplingParams
        from vllm.v1.core.sched.output import NewRequestData
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.request import Request
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner

        request = Request(req_id, list(prompt), SamplingParams(max_tokens=64, extra_args=extra_args), None,
                          cache_salt=salt)
        Scheduler.add_request(self.scheduler, request)
        new = NewRequestData.from_request(request, ([],), list(prompt))
        self.sent[req_id] = new
        GPUModelRunner.add_requests(self.runner, SimpleNamespace(scheduled_new_reqs=[new]))
        return self.states.req_id_to_index[req_id]

    def step(self, req_ids: list[str], new_tokens: dict[str, list[int]]) -> dict[str, list[int]]:
        """Each request's sampled tokens written, then one propose; each row's real draft tokens."""
        slots = np.asarray([self.states.req_id_to_index[r] for r in req_ids], dtype=np.int32)
        for req_id, slot in zip(req_ids, slots):
            if new_tokens.get(req_id):
                self.states.append(int(slot), new_tokens[req_id])
        num_sampled = torch.tensor([len(new_tokens.get(r, [])) for r in req_ids], dtype=torch.int32)
        batch = SimpleNamespace(num_reqs=len(req_ids), req_ids=req_ids, idx_mapping=torch.from_numpy(slots),
                                idx_mapping_np=slots)
        drafts = self.speculator.propose(batch, None, None, None, None, num_sampled, torch.zeros_like(num_sampled),
                                         self.states.last_sampled_tokens, None, None, None)
        return {r: drafts[i, : int(self.speculator.num_valid[i])].tolist() for i, r in enumerate(req_ids)}

    def finish(self, req_id: str) -> None:
        self.speculator.on_requests_finished({req_id})  # as vLLM calls it: token history still readable
        self.states.remove_request(req_id)


def test_two_tenants_get_different_scopes_and_no_salt_the_shared_one(route):
    from freespec.proposers.api import SHARED_SCOPE
    from freespec.vllm_plugins.request_ids import scope_of

    engine = Engine()
    slots = {r: engine.add(r, PROMPT, salt) for r, salt in
             (("a1", "tenant-a"), ("a2", "tenant-a"), ("b1", "tenant-b"), ("n1", None))}
    scope = {r: engine.speculator.scopes.of(slot) for r, slot in slots.items()}
    assert scope["a1"] == scope["a2"] == scope_of("tenant-a")
    assert scope["b1"] == scope_of("tenant-b") != scope["a1"]
    assert scope["n1"] == SHARED_SCOPE
    ids = engine.speculator.scopes.ids
    assert ids[slots["a1"]] == ids[slots["a2"]] != ids[slots["b1"]] and ids[slots["n1"]] == 1
    # The salt itself never reaches the worker: only its one-way hash rides in the params vLLM sends.
    for req_id in ("a1", "b1"):
        assert "tenant" not in repr(engine.sent[req_id].sampling_params.extra_args)


def test_a_client_cannot_name_another_tenants_scope(route):
    from freespec.vllm_plugins.request_ids import SCOPE_ARG, scope_of

    engine = Engine()
    slot = engine.add("x", PROMPT, "tenant-a", extra_args={SCOPE_ARG: scope_of("tenant-b")})
    assert engine.speculator.scopes.of(slot) == scope_of("tenant-a")
    slot = engine.add("y", PROMPT, None, extra_args={SCOPE_ARG: scope_of("tenant-b")})
    assert engine.speculator.scopes.of(slot) == ""


def test_a_slot_taken_by_a_new_request_keeps_no_earlier_tenants_scope(route):
    engine = Engine()
    slot = engine.add("a1", PROMPT, "tenant-a")
    engine.finish("a1")
    engine.speculator.add_request(slot)  # a request vLLM adds without a stamp: no tenant's scope
    assert engine.speculator.scopes.of(slot) is None


def run_answer(engine: Engine, req_id: str, salt: str | None) -> None:
    """A request that answers ANSWER over a few steps, then finishes (copy pools it under its scope)."""
    engine.add(req_id, PROMPT, salt)
    engine.step([req_id], {req_id: [ANSWER[0]]})
    for i in range(1, len(ANSWER), 6):
        engine.step([req_id], {req_id: ANSWER[i: i + 6]})
    engine.finish(req_id)


@pytest.mark.parametrize("scope_option", [None, "salt"])
def test_a_tenant_never_drafts_from_another_tenants_learned_responses(route, scope_option):
    engine = Engine(None if scope_option is None else {"scope": scope_option})
    run_answer(engine, "a1", "tenant-a")
    asking = PROMPT + ANSWER[:6]  # a new request whose context starts the answer
    for req_id, salt in (("b1", "tenant-b"), ("n1", None), ("a2", "tenant-a")):
        engine.add(req_id, asking, salt)
    drafts = engine.step(["b1", "n1", "a2"], {"b1": [ANSWER[6]], "n1": [ANSWER[6]], "a2": [ANSWER[6]]})
    assert drafts["a2"] and drafts["a2"] == ANSWER[7: 7 + len(drafts["a2"])]  # its own tenant's answer
    assert drafts["b1"] == [] and drafts["n1"] == []  # not another tenant's, nor the shared scope's


def test_without_the_route_salt_learns_nothing_across_requests(monkeypatch):
    """Patch disabled (FREESPEC_DISABLE_PATCHES): not installed; every slot of "salt" keeps no scope."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    from freespec.vllm_plugins.patches import installing

    monkeypatch.setattr(Scheduler, "add_request", Scheduler.add_request)
    monkeypatch.setattr(GPUModelRunner, "add_requests", GPUModelRunner.add_requests)
    monkeypatch.setenv("FREESPEC_DISABLE_PATCHES", "v2_salt_route")
    assert installing.salt_patch() == "v2_salt_route"
    installing._install(installing.salt_patch())
    assert not getattr(GPUModelRunner.add_requests, "_freespec", False)
    engine = Engine()
    run_answer(engine, "a1", "tenant-a")
    slot = engine.add("a2", PROMPT + ANSWER[:6], "tenant-a")
    assert engine.speculator.scopes.of(slot) is None
    assert engine.step(["a2"], {"a2": [ANSWER[6]]})["a2"] == []


def test_the_route_leaves_a_runner_without_freespecs_speculator_alone(route):
    runner = SimpleNamespace(speculator=SimpleNamespace(), req_states=SimpleNamespace(req_id_to_index={"r": 0}))
    out = SimpleNamespace(scheduled_new_reqs=[SimpleNamespace(req_id="r", sampling_params=None)])
    assert route.route_scopes(runner, out) == 0


def test_the_probe_and_doctor_see_the_route_on_0_34():
    from freespec.vllm_plugins import probes
    from freespec.vllm_plugins.patches import patch_states

    result = probes.probe_v2_salt_route()
    assert result.ok and "v2_salt_route" in result.detail
    states = {p["name"]: p["state"] for p in patch_states({r.seam: r for r in probes.run_probes()}, {})}
    assert states["v2_salt_route"] == "acting" and states["cache_salt_scope"] == "not needed"


def test_source_check_holds_the_route_on_0_34_and_fails_where_the_slot_comes_after_add_request():
    import os

    from freespec.vllm_plugins import source_check
    from freespec.vllm_plugins.seams import V2_RUNNER

    site = os.path.dirname(os.path.dirname(vllm.__file__))
    assert "patch v2_salt_route" in source_check.check_v2_salt_route(source_check.Source(site))

    class Moved(source_check.Source):  # the slot looked up after the speculator's add_request
        def text(self, rel: str) -> str:
            text = super().text(rel)
            if rel != V2_RUNNER:
                return text
            slot = "req_index = self.req_states.req_id_to_index[req_id]"
            assert slot in text
            return text.replace(slot, "req_index = 0", 1).replace(
                "self.speculator.add_request(req_index)", f"self.speculator.add_request(req_index)\n            {slot}", 1)

    with pytest.raises(source_check.Moved, match="slot"):
        source_check.check_v2_salt_route(Moved(site))
