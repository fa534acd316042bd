"""``freespec_hybrid``'s GPU-path speculator (``vllm_plugins/v2/suffix_hybrid.py``) against vLLM 0.34's own
``SuffixSpeculator``, their Triton kernels run by Triton's interpreter on CPU tensors (``TRITON_INTERPRET=1``).

vLLM turns Triton off where no GPU driver is active (``vllm.triton_utils.HAS_TRITON``); with
``CUDA_VISIBLE_DEVICES`` empty it keeps it on (its rule for distributed workers), so this module sets both
variables and, where ``vllm.triton_utils`` was imported before, imports it and the two speculator modules again.
Histories: recorded greedy agent turns in a request state laid out as vLLM's (``test_speculators.HistoryState``),
rows in shuffled batch order, requests finishing and new ones taking their slots.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import random
import sys
from types import SimpleNamespace

import numpy as np
import pytest

vllm = pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from test_speculators import TURNS, HistoryState  # noqa: E402  (the tier's folder is on sys.path)

K = 4
MAX_LEN = 384  # the interpreter's time goes with it (3 blocks of 128 a row)
CORPUS_TOKENS = 1 << 13


def _triton_on() -> bool:
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import vllm.triton_utils as tu

    if not tu.HAS_TRITON:
        importlib.reload(tu.importing)
        importlib.reload(tu)
        for name in ("vllm.v1.worker.gpu.spec_decode.suffix.speculator", "freespec.vllm_plugins.v2.suffix_hybrid"):
            if name in sys.modules:
                importlib.reload(sys.modules[name])
    return bool(tu.HAS_TRITON)


@pytest.fixture(scope="module")
def mods():
    if not _triton_on():
        pytest.skip("Triton's interpreter is not usable here")
    from vllm.v1.worker.gpu.spec_decode.suffix import speculator as upstream

    from freespec.vllm_plugins.v2 import suffix_hybrid

    return SimpleNamespace(upstream=upstream, ours=suffix_hybrid)


@pytest.fixture(autouse=True)
def no_pinned_memory(monkeypatch):
    import vllm.utils.torch_utils as tu

    monkeypatch.setattr(tu, "PIN_MEMORY", False)  # CPU tensors: nothing to pin (no driver)


def make_config(options, adaptive=True, max_reqs=4):
    from vllm.config import SpeculativeConfig
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    spec = SpeculativeConfig(method="freespec_hybrid", num_speculative_tokens=K, speculator_options=options,
                             suffix_decoding_corpus_tokens=CORPUS_TOKENS, enable_adaptive_verification=adaptive)
    return SimpleNamespace(
        speculative_config=spec, parallel_config=SimpleNamespace(tensor_parallel_size=1),
        model_config=SimpleNamespace(get_vocab_size=lambda: 49_152, max_model_len=MAX_LEN, model="recorded",
                                     tokenizer="recorded"),
        scheduler_config=SimpleNamespace(max_num_seqs=max_reqs),
    )


def batch_of(slots):
    slots = np.asarray(slots, dtype=np.int32)
    return SimpleNamespace(num_reqs=len(slots), idx_mapping=torch.from_numpy(slots), idx_mapping_np=slots)


def propose(speculator, states, slots, new, rejected):
    """One step; (drafts, num_valid, confidences) of its rows, copied."""
    num_sampled = torch.tensor(new, dtype=torch.int32)
    out = speculator.propose(batch_of(slots), None, None, None, None, num_sampled,
                             torch.tensor(rejected, dtype=torch.int32), states.last_sampled_tokens, None, None, None)
    n = len(slots)
    return (out.clone(), speculator.num_valid[:n].clone(), speculator.draft_token_confidence_probs[:n].clone())


class Scripted:
    """Requests over recorded turns, three live at a time; each step every speculator in ``drivers`` proposes
    for its rows, and the target accepts the first driver's draft's common prefix with the recording, plus one
    token. ``drivers``: (speculator, which rows it sees: ``scope -> bool``), ``scopes``: a request's scope."""

    def __init__(self, turns, scopes, seed=0, max_live=3, max_reqs=4):
        self.states = HistoryState(max_reqs, MAX_LEN)
        self.waiting = list(enumerate(turns))
        self.scopes, self.max_live = scopes, max_live
        self.rng = random.Random(seed)
        self.live: dict[str, dict] = {}

    def run(self, drivers, check, steps_cap=10_000):
        steps = 0
        while (self.waiting or self.live) and steps < steps_cap:
            while self.waiting and len(self.live) < self.max_live:
                i, turn = self.waiting.pop(0)
                req_id = f"req-{i}"
                slot = self.states.add_request(req_id, list(turn["prompt"]))
                scope = self.scopes(i)
                for speculator, sees in drivers:
                    if sees(scope):
                        speculator.add_request(slot)
                        if hasattr(speculator, "scopes"):
                            speculator.scopes.assign(slot, scope)  # as patch v2_salt_route does
                self.live[req_id] = dict(turn=turn, slot=slot, made=0, new=0, rejected=0, scope=scope)
            order = list(self.live)
            self.rng.shuffle(order)
            results = []
            for speculator, sees in drivers:
                rows = [r for r in order if sees(self.live[r]["scope"])]
                got = propose(speculator, self.states, [self.live[r]["slot"] for r in rows],
                              [self.live[r]["new"] for r in rows], [self.live[r]["rejected"] for r in rows])
                results.append(dict(zip(rows, zip(*got))))
            check(steps, order, results)
            first = results[0]
            for r in order:
                st = self.live[r]
                drafts, valid, _ = first[r]
                expected = drafts[: int(valid)].tolist()
                out = st["turn"]["output"]
                accepted = 0
                while (accepted < len(expected) and st["made"] + accepted < len(out)
                       and expected[accepted] == out[st["made"] + accepted]):
                    accepted += 1
                new = out[st["made"]: st["made"] + accepted + 1]
                self.states.append(st["slot"], new)
                st["made"] += len(new)
                st["new"], st["rejected"] = len(new), (K - accepted if st["new"] else 0)
            finished = sorted(r for r in order if self.live[r]["made"] >= len(self.live[r]["turn"]["output"]))
            for speculator, sees in drivers:
                mine = [r for r in finished if sees(self.live[r]["scope"])]
                if mine:
                    speculator.on_requests_finished(mine)
            for r in finished:
                self.states.remove_request(r)
                del self.live[r]
            steps += 1
        return steps


def ours(mods, states, options, adaptive=True):
    return mods.ours.SuffixHybridSpeculator(make_config(options, adaptive), torch.device("cpu"), req_states=states)


def upstream(mods, states, adaptive=True):
    return mods.upstream.SuffixSpeculator(make_config({}, adaptive), torch.device("cpu"), req_states=states)


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


# Turns 6-8 and 9-11 repeat each other's outputs across requests: the corpus drafts.
SHORT = [{"prompt": TURNS[i]["prompt"][-256:], "output": TURNS[i]["output"][:56]} for i in (6, 9, 7, 10)]


def test_one_scope_drafts_what_vllms_suffix_speculator_drafts_every_step(mods):
    run = Scripted(SHORT, scopes=lambda i: "")
    mine, ref = ours(mods, run.states, {"scope": "global"}), upstream(mods, run.states)
    compared = []

    def check(step, order, results):
        for r in order:
            assert same(results[0][r], results[1][r]), (step, r)
            compared.append(int(results[0][r][1]))

    run.run([(mine, lambda s: True), (ref, lambda s: True)], check)
    assert sum(compared) > 40 and mine.errors == 0, sum(compared)  # drafted enough to compare


def test_two_scopes_each_draft_what_a_speculator_of_their_own_drafts(mods):
    """Requests alternate between tenants A and B; each row drafts what a vLLM speculator that saw only its
    tenant's requests drafts (its corpus, statistics and history), so nothing crosses from the other's corpus."""
    run = Scripted(SHORT, scopes=lambda i: (A, B)[i % 2], max_live=3)
    mine = ours(mods, run.states, {"scope": "salt"})
    ref_a, ref_b = upstream(mods, run.states), upstream(mods, run.states)
    compared = []

    def check(step, order, results):
        for r in order:
            ref = results[1] if r in results[1] else results[2]
            assert same(results[0][r][:2], ref[r][:2]), (step, r)
            compared.append(int(results[0][r][1]))

    run.run([(mine, lambda s: True), (ref_a, lambda s: s == A), (ref_b, lambda s: s == B)], check)
    assert sum(compared) > 30 and set(mine._corpora) == {A, B}, sum(compared)


def learned_request(mods, options, backend=None):
    states = HistoryState(4, MAX_LEN)
    mine = ours(mods, states, options)
    if backend is not None:
        mine.use_backend(backend)
    return states, mine


RESPONSE = list(range(1000, 1040))
A, B = (hashlib.blake2b(t, digest_size=16).hexdigest() for t in (b"tenant A", b"tenant B"))  # scope_of's form


def drafts_for(mine, states, prompt, scope):
    slot = states.add_request(f"q{len(states.req_id_to_index)}-{scope}", prompt)
    mine.add_request(slot)
    mine.scopes.assign(slot, scope)
    states.last_sampled_tokens[slot, 0] = prompt[-1]
    drafts, valid, _ = propose(mine, states, [slot], [1], [0])
    return drafts[0, : int(valid[0])].tolist()


class Backend:
    def __init__(self, learned=()):
        from freespec.proposers.learned import Learned

        self.queue = list(learned)
        self.added: list[tuple[str, list[int]]] = []
        self.Learned = Learned

    def add(self, scope, tokens):
        self.added.append((scope, list(map(int, tokens))))

    def take(self):
        return self.queue.pop(0) if self.queue else self.Learned()

    def close(self):
        pass


def test_learned_responses_draft_in_their_scope_only_and_leave_when_purged(mods):
    from freespec.proposers.learned import Learned

    backend = Backend([Learned(new=[(A, np.asarray(RESPONSE, dtype=np.int32))])])
    states, mine = learned_request(mods, {"scope": "salt"}, backend)
    prompt = [7, 8, 9] + RESPONSE[:10]
    assert drafts_for(mine, states, prompt, A) == RESPONSE[10:10 + K]  # taken, ingested, drafted
    assert drafts_for(mine, states, prompt, B) == []  # another tenant: its own history only
    assert drafts_for(mine, states, prompt, None) == []
    backend.queue.append(Learned(forget=[A]))
    mine._taken_at = -1e9  # the next step asks the backend
    assert drafts_for(mine, states, prompt, A) == []


def test_a_finished_response_reaches_the_backend_at_a_later_step_with_its_prompt_tail(mods):
    backend = Backend()
    states, mine = learned_request(mods, {"scope": "global"}, backend)
    prompt = list(range(50, 90))
    slot = states.add_request("done", prompt)
    mine.add_request(slot)
    states.append(slot, RESPONSE[:12])
    mine.on_requests_finished(["done"])
    assert backend.added == []  # handed on at a step, never in the call that finishes it
    states.remove_request("done")
    other = [3, 4] + RESPONSE[:6]
    assert drafts_for(mine, states, other, "") == RESPONSE[6:6 + K]  # the corpus has it
    assert backend.added == [("", prompt[-mine.prompt_tail:] + RESPONSE[:12])]


def test_warm_up_responses_are_not_kept_and_learned_ones_come_back_after_reset(mods):
    from freespec.proposers.learned import Learned

    backend = Backend([Learned(new=[("", np.asarray(RESPONSE, dtype=np.int32))])])
    states, mine = learned_request(mods, {"scope": "global"}, backend)
    prompt = [1, 2] + RESPONSE[:8]
    assert drafts_for(mine, states, prompt, "") == RESPONSE[8:8 + K]
    slot = states.add_request("warm", [5, 6, 7])
    mine.add_request(slot)
    states.append(slot, [11, 12, 13])
    mine.on_requests_finished(["warm"])
    mine.reset_state()
    assert drafts_for(mine, states, prompt, "") == RESPONSE[8:8 + K]  # ingested again after the reset
    assert backend.added == []


class HostReads(torch.overrides.TorchFunctionMode):
    """Records each read of a tensor's values by the host (what waits for the device on a GPU) outside a Triton
    launch: ``item``, ``tolist``, ``cpu``, ``numpy``, truth and number conversions, ``nonzero``."""

    READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.__bool__,
             torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.nonzero,
             torch.nonzero}

    def __init__(self, allowed_storages=()):
        super().__init__()
        self.allowed = set(allowed_storages)
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.READS and args and isinstance(args[0], torch.Tensor):
            frames = [f for f in _stack() if f"{os.sep}triton{os.sep}" in f.f_code.co_filename]
            if not frames and args[0].untyped_storage().data_ptr() not in self.allowed:
                where = [f"{f.f_code.co_filename}:{f.f_lineno}" for f in _stack()
                         if f"{os.sep}torch{os.sep}" not in f.f_code.co_filename and f.f_code.co_filename != __file__]
                self.reads.append(f"{func.__name__} at {where[0] if where else '?'}")
        return func(*args, **(kwargs or {}))


def _stack():
    frame = sys._getframe(1)
    while frame is not None:
        yield frame
        frame = frame.f_back


def test_propose_reads_no_tensor_on_the_host(mods, monkeypatch):
    """What it proves: on the propose path (two scopes in one batch, learned responses being ingested, a
    finished response handed to the backend) no tensor's values are read by the host outside Triton's launches
    (the interpreter's own copies), so on a GPU nothing there waits for the device; the host buffers of a
    finished response, read once their copy is done, are the exception. The host-synced speculator is caught."""
    from freespec.proposers.learned import Learned

    backend = Backend([Learned(new=[(A, np.asarray(RESPONSE, dtype=np.int32))])])
    states, mine = learned_request(mods, {"scope": "salt"}, backend)
    slots = []
    for i, scope in enumerate([A, B, A]):
        slot = states.add_request(f"r{i}", [9, 8] + RESPONSE[: 6 + i])
        mine.add_request(slot)
        mine.scopes.assign(slot, scope)
        slots.append(slot)
    done = states.add_request("done", [1, 2, 3])
    mine.add_request(done)
    mine.scopes.assign(done, B)
    states.append(done, [4, 5])
    mine.on_requests_finished(["done"])
    allowed = [o.tokens.untyped_storage().data_ptr() for o in mine._outgoing]
    allowed += [o.length.untyped_storage().data_ptr() for o in mine._outgoing]
    with HostReads(allowed) as guard:
        drafts, valid, _ = propose(mine, states, slots, [1, 1, 1], [0, 0, 0])
    assert guard.reads == [] and mine.errors == 0
    assert drafts[0, : int(valid[0])].tolist() == RESPONSE[6:6 + K] and int(valid[1]) == 0
    assert backend.added == [(B, [1, 2, 3, 4, 5])]

    from freespec.vllm_plugins.v2 import speculator as host

    monkeypatch.setattr(host, "_tokenizer_fingerprint", lambda path: "recorded")
    config = make_config({"scope": "global", "sources": ["copy"]})
    synced = host.FreespecSpeculator(config, torch.device("cpu"), req_states=states)
    for slot in slots:
        synced.add_request(slot)
    with HostReads() as guard:
        synced.propose(batch_of(slots), None, None, None, None, torch.ones(3, dtype=torch.int32),
                       torch.zeros(3, dtype=torch.int32), states.last_sampled_tokens, None, None, None)
    assert any("speculator.py" in read for read in guard.reads)


def test_hybrid_builds_the_gpu_speculator_only_for_its_default_sources(mods, monkeypatch, tmp_path):
    from freespec.vllm_plugins.v2 import speculator as host

    monkeypatch.setattr(host, "_tokenizer_fingerprint", lambda path: "recorded")
    states = HistoryState(4, MAX_LEN)
    build = mods.ours.HybridV2Speculator
    for options in ({}, {"state_dir": str(tmp_path / "state")}):
        assert type(build(make_config(options), torch.device("cpu"), states)) is mods.ours.SuffixHybridSpeculator
    for options in ({"sources": ["copy"]}, {"sources": ["recycle"]}):
        assert type(build(make_config(options), torch.device("cpu"), states)) is host.HybridSpeculator
    assert mods.ours.seam_problems() == []


def test_a_restart_drafts_what_the_folder_state_dir_kept(mods, monkeypatch, tmp_path):
    """Through the real folder backend (``proposers.learned.folder_log``): a response learned before a restart
    is read at start, ingested at the first step and drafted."""
    from freespec.vllm_plugins.v2 import speculator as host

    monkeypatch.setattr(host, "_tokenizer_fingerprint", lambda path: "recorded")
    options = {"scope": "global", "state_dir": str(tmp_path / "state")}
    states, first = learned_request(mods, options)
    slot = states.add_request("done", [60, 61, 62, 63])
    first.add_request(slot)
    states.append(slot, RESPONSE[:20])
    first.on_requests_finished(["done"])
    states.remove_request("done")
    drafts_for(first, states, [5, 6, 7], "")  # the step that hands it to the backend
    first.backend.close()
    states, second = learned_request(mods, options)
    assert drafts_for(second, states, [8, 9] + RESPONSE[:5], "") == RESPONSE[5:5 + K]
    second.backend.close()


def test_hybrids_config_declares_what_vllms_suffix_config_declares():
    """Dense token history (the kernels scan each row's history every step) and confidences from acceptance
    counts, not draft logits; other plugins keep the defaults."""
    from vllm.v1.worker.gpu.spec_decode.suffix.config import SuffixSpeculatorConfig

    hybrid = make_config({}).speculative_config.speculator_config
    for name in ("prefer_dense_token_history", "adaptive_verification_uses_draft_logits"):
        assert getattr(hybrid, name) == getattr(SuffixSpeculatorConfig, name)
    from freespec.vllm_plugins.v2.config import config_class

    assert not config_class("copy").prefer_dense_token_history
