"""A plugin's state survives a served stop: ``freespec serve`` gives vLLM a shutdown timeout where a plugin keeps
state on disk, and the worker warns where vLLM would kill it before its final save (``vllm_cli``, ``adapter``).
The engine itself: integration_tests/test_stop_saves.py."""
from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from freespec.proposers.learned import exit_save
from freespec.vllm_plugins.adapter import warn_if_stop_skips_saves
from freespec.vllm_plugins.patches import json_flag_values, plugin_requested
from freespec.vllm_plugins.vllm_cli import STOP_GRACE_S, keeps_state, with_stop_grace


def serve(spec: dict, *extra: str) -> list[str]:
    return ["serve", "/models/m", "--speculative-config", json.dumps(spec), *extra]


GRACE = ["--shutdown-timeout", str(STOP_GRACE_S)]


@pytest.mark.parametrize("spec", [
    {"plugin": "hybrid", "state_dir": "/srv/state"},
    {"plugin": "hybrid", "suffix": {"responses_path": "/srv/r.bin"}},
    {"plugin": "recycle", "matrix_path": "/srv/m.npz"},
])
def test_a_plugin_that_keeps_state_on_disk_gets_a_shutdown_timeout(spec):
    assert with_stop_grace(serve(spec), supported=True) == [*serve(spec), *GRACE]


def test_the_dotted_spelling_freespec_serve_writes_for_state_dir_gets_it_too():
    args = ["serve", "m", "--speculative-config.plugin=hybrid", "--speculative-config.state_dir=/s"]
    assert with_stop_grace(args, supported=True) == [*args, *GRACE]
    assert with_stop_grace(args[:3], supported=True) == args[:3]


def test_the_stock_spelling_with_options_in_additional_config_gets_it_too():
    args = ["serve", "m", "--speculative-config", '{"method": "custom_class"}',
            "--additional-config={\"freespec\": {\"plugin\": \"hybrid\", \"options\": {\"state_dir\": \"/s\"}}}"]
    assert with_stop_grace(args, supported=True) == [*args, *GRACE]


@pytest.mark.parametrize("args", [
    serve({"plugin": "hybrid"}),  # nothing on disk: vLLM's own abort at a stop
    serve({"plugin": "hybrid", "state_dir": None}),
    serve({"plugin": "hybrid", "state_dir": "/s"}, "--shutdown-timeout", "0"),  # the operator's own choice
    serve({"plugin": "hybrid", "state_dir": "/s"}, "--shutdown_timeout=3"),
])
def test_nothing_is_added_without_state_or_over_the_operators_value(args):
    assert with_stop_grace(args, supported=True) == args


def test_nothing_is_added_where_vllm_has_no_such_flag():
    args = serve({"plugin": "hybrid", "state_dir": "/s"})
    assert with_stop_grace(args, supported=False) == args


def test_keeps_state_looks_at_every_depth_and_ignores_empty_values():
    assert keeps_state({"a": [{"b": {"matrix_path": "/m"}}]})
    assert not keeps_state({"responses_path": "", "other": {"path": "/x"}})
    assert not keeps_state("state_dir")


def test_json_flag_values_reads_both_spellings_and_skips_what_is_not_json():
    argv = ["--speculative-config", '{"a": 1}', "--speculative_config={\"b\": 2}", "--speculative-config", "{",
            "--speculative-config"]
    assert list(json_flag_values("--speculative-config", argv)) == [{"a": 1}, {"b": 2}]
    assert plugin_requested(["serve", "--speculative-config", '{"plugin": "copy"}'])
    assert plugin_requested(["serve", "--speculative-config.plugin=copy"])
    assert not plugin_requested(["serve", "--speculative-config", '{"method": "ngram"}'])


@pytest.fixture
def saving(monkeypatch):
    monkeypatch.setattr(exit_save, "_registered", [])
    return exit_save._registered


def test_the_worker_warns_once_where_a_zero_timeout_would_skip_its_save(saving, caplog):
    saving += ["suffix responses", "recycle"]
    with caplog.at_level(logging.WARNING, logger="freespec"):
        warn_if_stop_skips_saves(SimpleNamespace(shutdown_timeout=0))
    assert len(caplog.records) == 1
    assert "suffix responses and recycle saved at exit" in caplog.records[0].getMessage()
    assert "--shutdown-timeout" in caplog.records[0].getMessage()


@pytest.mark.parametrize("registered, config", [
    ([], SimpleNamespace(shutdown_timeout=0)),  # nothing to save
    (["recycle"], SimpleNamespace(shutdown_timeout=10)),  # time to save
    (["recycle"], SimpleNamespace()),  # a vLLM without the setting
])
def test_no_warning_without_state_or_with_time_to_save(saving, caplog, registered, config):
    saving += registered
    with caplog.at_level(logging.WARNING, logger="freespec"):
        warn_if_stop_skips_saves(config)
    assert not caplog.records


def test_save_at_exit_records_what_it_saves(saving, monkeypatch):
    monkeypatch.setattr(exit_save.atexit, "register", lambda fn: None)
    monkeypatch.setattr(exit_save.signal, "signal", lambda sig, handler: None)  # not this test process's SIGTERM
    exit_save.save_at_exit(lambda: None, "recycle")
    assert exit_save.registered() == ("recycle",)
