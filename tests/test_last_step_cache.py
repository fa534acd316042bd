"""Patch ``last_step_cache``: which finished requests have their last accepted tokens cached, and how many; in
which engines it acts (a freespec plugin's; vLLM's ngram and suffix only with ``FREESPEC_FIX_VLLM``).

Stand-in scheduler and request objects (the rule is pure logic over their fields); the wrapper is installed
on vLLM's real ``Scheduler`` class and restored after. The engine test is
integration_tests/test_last_step_cache.py.
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from freespec.vllm_plugins import patches, probes


class Manager:
    def __init__(self, enable_caching: bool = True) -> None:
        self.enable_caching = enable_caching
        self.cached: list[int] = []

    def cache_blocks(self, request, num_computed_tokens: int) -> None:
        self.cached.append(num_computed_tokens)


def scheduler(method: str | None = "custom_class", connector=None, can_free: bool = True, caching: bool = True,
              freespec: bool = True):
    spec = None if method is None else SimpleNamespace(method=method)
    additional = {"freespec": {"plugin": "hybrid"}} if freespec and method == "custom_class" else {}
    return SimpleNamespace(
        vllm_config=SimpleNamespace(speculative_config=spec, additional_config=additional),
        connector=connector,
        ec_connector=None,
        kv_cache_manager=Manager(caching),
        _request_blocks_can_be_freed=lambda request: can_free,
    )


def request(status: str = "FINISHED_STOPPED", computed: int = 140, tokens: int = 141, placeholders: int = 0,
            in_flight: int = 0):
    return SimpleNamespace(status=SimpleNamespace(name=status), num_computed_tokens=computed, num_tokens=tokens,
                           num_output_placeholders=placeholders, num_in_flight_tokens=in_flight)


@pytest.fixture
def fix_vllm(monkeypatch):
    """The operator's opt-in for vLLM's own methods."""
    monkeypatch.setenv("FREESPEC_FIX_VLLM", "last_step_cache")


@pytest.mark.parametrize("method", ["custom_class", "suffix", "ngram"])
def test_a_finished_text_drafting_request_caches_every_computed_token(method, fix_vllm):
    s = scheduler(method)
    assert patches.cache_finished_blocks(s, request(computed=140, tokens=141))
    assert s.kv_cache_manager.cached == [140]  # the bonus token's KV was never computed


def test_a_request_ended_at_a_stop_string_is_cached_too():
    s = scheduler()  # vLLM's front-end aborts a request whose text reached a stop string
    assert patches.cache_finished_blocks(s, request(status="FINISHED_ABORTED", computed=150, tokens=151))
    assert s.kv_cache_manager.cached == [150]


def test_a_stop_inside_the_accepted_tokens_caches_only_the_kept_tokens():
    s = scheduler()
    assert patches.cache_finished_blocks(s, request(status="FINISHED_LENGTH_CAPPED", computed=150, tokens=146))
    assert s.kv_cache_manager.cached == [146]


@pytest.mark.parametrize(
    "case, sched, req",
    [
        ("no speculation", scheduler(method=None), request()),
        ("a draft model's KV shares the cache", scheduler(method="draft_model"), request()),
        ("eagle", scheduler(method="eagle"), request()),
        ("vLLM's suffix without the opt-in", scheduler(method="suffix"), request()),
        ("vLLM's ngram without the opt-in", scheduler(method="ngram"), request()),
        ("another package's custom_class", scheduler(freespec=False), request()),
        ("a KV connector owns the blocks", scheduler(connector=object()), request()),
        ("a step in flight (batch queue)", scheduler(), request(status="FINISHED_ABORTED", in_flight=9)),
        ("an error", scheduler(), request(status="FINISHED_ERROR")),
        ("a step in flight (async scheduling)", scheduler(), request(placeholders=2)),
        ("a deferred free", scheduler(can_free=False), request()),
        ("prefix caching off", scheduler(caching=False), request()),
    ],
)
def test_nothing_is_cached_where_a_block_could_hold_kv_not_written_by_the_target_or_not_asked(case, sched, req,
                                                                                              monkeypatch):
    monkeypatch.delenv("FREESPEC_FIX_VLLM", raising=False)
    assert not patches.cache_finished_blocks(sched, req), case
    assert sched.kv_cache_manager.cached == []


@pytest.fixture
def vllm_scheduler(monkeypatch):
    """vLLM's Scheduler with a stand-in ``_free_request`` that records its calls (restored after the test)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    freed = []
    monkeypatch.setattr(Scheduler, "_free_request", lambda self, request, delay_free_blocks=False: freed.append(
        (request, delay_free_blocks)) or (None, None))
    monkeypatch.setattr(probes, "last_step_cache_state", lambda: ("defect", "stand-in"))
    return Scheduler, freed


def test_the_wrapper_caches_before_vllm_frees_and_installs_once(vllm_scheduler):
    Scheduler, freed = vllm_scheduler
    assert patches.install_last_step_cache()
    wrapped = Scheduler._free_request
    assert wrapped._freespec
    s, r = scheduler(), request()
    assert wrapped(s, r, delay_free_blocks=True) == (None, None)
    assert s.kv_cache_manager.cached == [140] and freed == [(r, True)]


def test_a_failing_cache_still_frees_the_request_and_warns_once(vllm_scheduler, monkeypatch, caplog):
    Scheduler, freed = vllm_scheduler
    patches.install_last_step_cache()

    def broken(scheduler, request):
        raise RuntimeError("moved")

    monkeypatch.setattr(patches.last_step_cache, "cache_finished_blocks", broken)
    with caplog.at_level(logging.WARNING, logger="freespec"):
        for _ in range(3):
            Scheduler._free_request(scheduler(), request())
    assert len(freed) == 3
    assert [r.message for r in caplog.records].count(
        "freespec: patch last_step_cache failed (RuntimeError('moved')); finished requests are freed as vLLM "
        "frees them") == 1


@pytest.mark.parametrize("opt_in", ["", "last_step_cache", "all", "cpu_expand_kernel"])
def test_the_opt_in_turns_the_fix_on_for_vllms_own_methods_only_when_it_names_it(opt_in, monkeypatch):
    monkeypatch.setenv("FREESPEC_FIX_VLLM", opt_in)
    for method in ("ngram", "suffix"):
        s = scheduler(method)
        assert patches.cache_finished_blocks(s, request()) == (opt_in in ("last_step_cache", "all")), method
    assert patches.cache_finished_blocks(scheduler("draft_model"), request()) is False  # never: draft KV


@pytest.mark.parametrize("state", ["moved", "absent"])
def test_nothing_is_installed_where_the_seam_moved_or_vllm_has_no_defect(vllm_scheduler, monkeypatch, state):
    """``absent``: vLLM ships the fix (PR #54979) and the patch retires itself: install is a no-op."""
    Scheduler, _ = vllm_scheduler
    monkeypatch.setattr(probes, "last_step_cache_state", lambda: (state, "stand-in"))
    assert not patches.install_last_step_cache()
    assert not getattr(Scheduler._free_request, "_freespec", False)


def test_the_probe_finds_the_defect_in_the_installed_vllm_and_the_fix_once_installed(monkeypatch):
    from vllm.v1.core.sched.scheduler import Scheduler

    current = Scheduler._free_request  # vLLM's own, even where a test process has the patch installed
    monkeypatch.setattr(Scheduler, "_free_request", getattr(current, "__wrapped__", current))
    before = probes.probe_last_step_cache()
    if before.state == "absent":
        pytest.skip("this vLLM caches the last step's tokens itself")
    assert not before.ok and before.state == "defect", before
    assert patches.install_last_step_cache()
    after = probes.probe_last_step_cache()
    assert after.ok and after.state == "fixed" and after.detail.startswith("fixed by freespec")


def _vllm_config(spec: dict | None, additional: dict | None = None):
    """A real ``SpeculativeConfig`` as vLLM builds it, on a stand-in ``VllmConfig``."""
    from vllm.config import SpeculativeConfig

    built = None if spec is None else SpeculativeConfig(**spec)
    return SimpleNamespace(speculative_config=built, additional_config=additional or {})


@pytest.mark.parametrize("spec", [None, {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3},
                                  {"method": "suffix", "num_speculative_tokens": 3}])
def test_a_stock_engine_config_gets_nothing_and_a_freespec_one_does(spec, monkeypatch):
    monkeypatch.delenv("FREESPEC_FIX_VLLM", raising=False)
    s = scheduler()
    s.vllm_config = _vllm_config(spec)
    assert not patches.acts_in(s) and not patches.cache_finished_blocks(s, request())
    freespec = scheduler()
    freespec.vllm_config = _vllm_config(
        {"method": "custom_class", "model": "freespec.vllm_plugins.adapter.FreespecProposer",
         "num_speculative_tokens": 3}, {"freespec": {"plugin": "copy"}})
    assert patches.acts_in(freespec) and patches.cache_finished_blocks(freespec, request())


@pytest.mark.parametrize("env, installed", [
    ({}, False),
    ({"FREESPEC_FIX_VLLM": "cpu_expand_kernel"}, False),
    ({"FREESPEC_FIX_VLLM": "last_step_cache"}, True),
    ({"FREESPEC_PLUGIN_ENGINE": "hybrid"}, True),
    ({"FREESPEC_PLUGIN_ENGINE": "hybrid", "FREESPEC_DISABLE_PATCHES": "last_step_cache"}, False),
])
def test_the_general_plugin_wraps_the_scheduler_only_for_a_freespec_engine_or_the_opt_in(
        vllm_scheduler, monkeypatch, env, installed):
    Scheduler, _ = vllm_scheduler
    for name in ("FREESPEC_FIX_VLLM", "FREESPEC_PLUGIN_ENGINE", "FREESPEC_DISABLE_PATCHES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(patches.speculative_config_frontend, "install_frontend", lambda: None)
    monkeypatch.setattr(patches.cpu_expand_kernel, "install_cpu_expand_fix", lambda: None)
    # this process's environment stays
    monkeypatch.setattr(patches.prometheus_multiproc, "install_prometheus_multiproc", lambda: None)
    monkeypatch.setattr(patches.cache_salt_scope, "install_cache_salt_scope", lambda: None)  # test_cache_salt_scope
    monkeypatch.setattr("sys.argv", ["vllm", "serve", "m"])
    patches.install_all()
    assert getattr(Scheduler._free_request, "_freespec", False) is installed
