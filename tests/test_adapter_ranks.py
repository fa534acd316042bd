"""Only the rank whose drafts vLLM takes builds a proposer (fakes for vLLM's ranks and executors; no engine).

vLLM builds the ``custom_class`` adapter on every tensor-parallel rank but asks
only TP rank 0 (PCP rank 0) of the last pipeline stage for drafts
(``probes.probe_draft_rank``). The real TP=2 engine is
integration_tests/test_tensor_parallel.py.
"""
from __future__ import annotations

import logging
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest

from freespec.proposers.copy import CopyProposer
from freespec.vllm_plugins import adapter as adapter_module
from freespec.vllm_plugins import probes, ranks
from freespec.vllm_plugins.frontend import translate
from freespec.vllm_plugins.ranks import DraftRank, decide_draft_rank
from freespec.vllm_plugins.probes import ProbeResult

OK = ProbeResult("draft_rank", True, "ok")
MOVED = ProbeResult("draft_rank", False, "MultiprocExecutor takes drafts from worker 1")


# ---------------------------------------------------------------- the rule
@pytest.mark.parametrize(
    "tp_rank, pcp_rank, drafts",
    [(0, 0, True), (1, 0, False), (3, 0, False), (0, 1, False), (1, 1, False)],
)
def test_only_tp_rank_0_and_pcp_rank_0_draft(tp_rank, pcp_rank, drafts):
    assert decide_draft_rank(tp_rank, 4, pcp_rank, 2, OK).drafts is drafts


def test_the_rank_is_named_for_the_log_line():
    assert decide_draft_rank(1, 2, 0, 1, OK).rank == "TP rank 1 of 2"
    assert decide_draft_rank(1, 2, 1, 2, OK).rank == "TP rank 1 of 2, PCP rank 1 of 2"


def test_when_the_probe_fails_every_rank_drafts_and_says_why():
    # drafting everywhere only wastes work; drafting nowhere would silently lose the speed-up
    got = decide_draft_rank(1, 2, 0, 1, MOVED)
    assert got.drafts and "draft_rank moved" in got.why and "worker 1" in got.why


def test_under_an_external_launcher_every_rank_drafts():
    # torchrun: each rank runs an engine of its own, which schedules with its own drafts
    assert decide_draft_rank(1, 2, 0, 1, OK, backend="external_launcher").drafts


# ---------------------------------------------------------------- reading the rank from vLLM's parallel state
def fake_parallel_state(monkeypatch, initialized=True, tp=(0, 1), pcp=(0, 1)):
    module = types.ModuleType("vllm.distributed.parallel_state")
    module.model_parallel_is_initialized = lambda: initialized
    module.get_tp_group = lambda: SimpleNamespace(rank_in_group=tp[0], world_size=tp[1])
    module.get_pcp_group = lambda: SimpleNamespace(rank_in_group=pcp[0], world_size=pcp[1])
    monkeypatch.setitem(sys.modules, "vllm.distributed.parallel_state", module)


def config(backend="mp"):
    return SimpleNamespace(parallel_config=SimpleNamespace(distributed_executor_backend=backend))


def test_draft_rank_reads_the_tp_rank_from_parallel_state(monkeypatch):
    monkeypatch.setattr(probes, "probe_draft_rank", lambda: OK)
    fake_parallel_state(monkeypatch, tp=(1, 2))
    assert ranks.draft_rank(config()) == DraftRank(False, "TP rank 1 of 2", "vLLM takes drafts from TP rank 0 only")
    fake_parallel_state(monkeypatch, tp=(0, 2))
    assert ranks.draft_rank(config()).drafts


def test_draft_rank_runs_the_probe_only_with_several_ranks(monkeypatch):
    calls = []
    monkeypatch.setattr(probes, "probe_draft_rank", lambda: calls.append(1) or MOVED)
    fake_parallel_state(monkeypatch, tp=(0, 1))
    assert ranks.draft_rank(config()).drafts and calls == []
    fake_parallel_state(monkeypatch, tp=(1, 2))
    assert ranks.draft_rank(config()).drafts and calls == [1]  # failed probe: drafts everywhere


def test_outside_a_vllm_worker_the_adapter_is_the_only_rank(monkeypatch):
    fake_parallel_state(monkeypatch, initialized=False)
    assert ranks.draft_rank(config()).drafts


# ---------------------------------------------------------------- the adapter on each kind of rank
class CountingCopy(CopyProposer):
    built = 0

    def __init__(self, *args, **kwargs):
        type(self).built += 1
        super().__init__(*args, **kwargs)


def make_adapter(monkeypatch, where: DraftRank):
    monkeypatch.setattr(adapter_module, "draft_rank", lambda cfg: where)
    monkeypatch.setattr(adapter_module, "load_proposer_class", lambda name: CountingCopy)
    monkeypatch.setattr(CountingCopy, "built", 0)
    _, extra = translate({"plugin": "copy", "num_speculative_tokens": 4}, None)
    cfg = SimpleNamespace(
        additional_config=extra,
        speculative_config=SimpleNamespace(num_speculative_tokens=4),
        model_config=SimpleNamespace(get_vocab_size=lambda: 1000, max_model_len=4096, model="m", tokenizer=None),
    )
    return adapter_module.FreespecProposer(cfg)


def repeating_batch():
    """Two rows whose text repeats itself: copy drafts on both."""
    tokens = np.tile(np.arange(10, dtype=np.int32), (2, 20))
    return [[9], [9]], np.array([100, 100], dtype=np.int32), tokens


def test_an_ignored_rank_builds_nothing_and_drafts_nothing(monkeypatch, caplog):
    with caplog.at_level(logging.INFO, logger="freespec"):
        adapter = make_adapter(monkeypatch, DraftRank(False, "TP rank 1 of 2", "vLLM takes drafts from TP rank 0 only"))
    assert CountingCopy.built == 0 and adapter.proposer is None
    adapter.load_model(object())  # vLLM's CPU runner calls it on every rank
    assert adapter.propose(*repeating_batch()) == [[], []]
    lines = [r.getMessage() for r in caplog.records if r.name == "freespec"]
    assert lines == ["freespec: TP rank 1 of 2: plugin 'copy' not built here "
                     "(vLLM takes drafts from TP rank 0 only); this rank drafts nothing"]


def test_the_drafting_rank_builds_the_plugin_and_drafts(monkeypatch, caplog):
    with caplog.at_level(logging.INFO, logger="freespec"):
        adapter = make_adapter(monkeypatch, DraftRank(True, "TP rank 0 of 2", "vLLM takes its drafts from this rank"))
    assert CountingCopy.built == 1
    drafts = adapter.propose(*repeating_batch())
    assert all(drafts) and all(len(d) <= 4 for d in drafts)
    assert any("TP rank 0 of 2: plugin 'copy' runs here" in r.getMessage() for r in caplog.records)


def test_a_bad_option_is_refused_on_every_rank(monkeypatch):
    monkeypatch.setattr(adapter_module, "draft_rank", lambda cfg: DraftRank(False, "TP rank 1 of 2", ""))
    cfg = SimpleNamespace(additional_config={"freespec": {"plugin": "copy", "options": {"colour": 1}}},
                          speculative_config=SimpleNamespace(num_speculative_tokens=4))
    with pytest.raises(ValueError, match="colour"):
        adapter_module.FreespecProposer(cfg)


# ---------------------------------------------------------------- the probe, against stand-in vLLM modules
# Stand-ins whose source the probe reads: written like vLLM 0.30-0.32 (the same in all three).
def initialize_model_parallel(world_size, data_parallel_size, pipeline_model_parallel_size,
                              prefill_context_model_parallel_size, tensor_model_parallel_size):
    import torch

    all_ranks = torch.arange(world_size).reshape(
        -1,
        data_parallel_size,
        pipeline_model_parallel_size,
        prefill_context_model_parallel_size,
        tensor_model_parallel_size,
    )  # noqa
    return all_ranks


def tp_outermost_layout(world_size, data_parallel_size, pipeline_model_parallel_size,
                        prefill_context_model_parallel_size, tensor_model_parallel_size):
    import torch

    return torch.arange(world_size).reshape(
        -1, tensor_model_parallel_size, data_parallel_size, pipeline_model_parallel_size,
        prefill_context_model_parallel_size,
    )


class Executor:
    def collective_rpc(self, method):
        return [method]

    def take_draft_token_ids(self):
        output = self.collective_rpc("take_draft_token_ids")
        return output[0]


class MultiprocExecutor(Executor):
    output_rank = 0

    def collective_rpc(self, method, unique_reply_rank=None):
        return method

    def take_draft_token_ids(self):
        return self.collective_rpc(
            "take_draft_token_ids",
            unique_reply_rank=self.output_rank,
        )

    def _get_output_rank(self) -> int:
        config = self.parallel_config
        return self.world_size - config.tensor_parallel_size * config.prefill_context_parallel_size


def last_tp_rank(self) -> int:
    return self.world_size - 1


def reads_a_new_field(self) -> int:
    return self.world_size - self.parallel_config.decode_context_parallel_size


def install_executors(monkeypatch, *, layout=initialize_model_parallel, output_rank=None):
    ps = types.ModuleType("vllm.distributed.parallel_state")
    ps.model_parallel_is_initialized = lambda: True
    ps.get_tp_group = ps.get_pcp_group = lambda: None
    ps.initialize_model_parallel = layout
    abstract = types.ModuleType("vllm.v1.executor.abstract")
    abstract.Executor = Executor
    mp = types.ModuleType("vllm.v1.executor.multiproc_executor")
    mp.MultiprocExecutor = type("MultiprocExecutor", (MultiprocExecutor,), {})
    if output_rank is not None:
        mp.MultiprocExecutor._get_output_rank = output_rank
    for name, module in (("vllm.distributed.parallel_state", ps), ("vllm.v1.executor.abstract", abstract),
                         ("vllm.v1.executor.multiproc_executor", mp)):
        monkeypatch.setitem(sys.modules, name, module)


def test_probe_passes_on_vllms_layout(monkeypatch):
    install_executors(monkeypatch)
    assert probes.probe_draft_rank().ok


def test_probe_names_an_output_rank_that_moved(monkeypatch):
    install_executors(monkeypatch, output_rank=last_tp_rank)
    got = probes.probe_draft_rank()
    assert not got.ok and "takes drafts from worker 1 of a PP=1 PCP=1 TP=2 world" in got.detail


def test_probe_names_an_output_rank_rule_that_reads_more_than_it_knows(monkeypatch):
    install_executors(monkeypatch, output_rank=reads_a_new_field)
    got = probes.probe_draft_rank()
    assert not got.ok and "decode_context_parallel_size" in got.detail


def test_probe_names_a_changed_rank_layout(monkeypatch):
    install_executors(monkeypatch, layout=tp_outermost_layout)
    got = probes.probe_draft_rank()
    assert not got.ok and "layout changed" in got.detail


def test_probe_names_a_missing_parallel_state_function(monkeypatch):
    install_executors(monkeypatch)
    monkeypatch.delattr(sys.modules["vllm.distributed.parallel_state"], "get_pcp_group")
    got = probes.probe_draft_rank()
    assert not got.ok and "get_pcp_group" in got.detail


def test_probe_fails_when_every_worker_is_asked_for_drafts(monkeypatch):
    install_executors(monkeypatch)
    monkeypatch.setattr(sys.modules["vllm.v1.executor.multiproc_executor"].MultiprocExecutor,
                        "take_draft_token_ids", Executor.take_draft_token_ids)
    got = probes.probe_draft_rank()
    assert not got.ok and "output rank only" in got.detail


def test_doctor_says_what_a_failed_draft_rank_probe_costs():
    from freespec.vllm_plugins.doctor import _status

    assert _status(MOVED, expand_hook=True) == "WARN, every TP rank builds its proposer"
    assert "draft_rank" not in probes.BLOCKING  # a moved rank rule never turns speculation off
