"""Every freespec plugin is a registered V2 method, through the real entry point, and configured by vLLM's own
``SpeculativeConfig``: options accepted through ``speculator_options``, a bad one refused naming the field."""
from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm")

PLUGINS = ("copy", "hybrid", "pearl", "recycle", "retrieval")


@pytest.fixture(scope="module")
def registered():
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # vLLM's own loader: the vllm.general_plugins entry point, freespec's register()
    from vllm.v1.worker.gpu.spec_decode.speculator_config import registered_speculative_methods

    return registered_speculative_methods()


def spec_config(method, k=4, **options):
    from vllm.config import SpeculativeConfig

    return SpeculativeConfig(method=method, num_speculative_tokens=k, speculator_options=options or None)


def test_the_entry_point_registers_every_plugin(registered):
    assert {f"freespec_{p}" for p in PLUGINS} <= set(registered)


def test_speculative_config_takes_each_method_with_its_options(registered, tmp_path, datastore):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')  # checked as a checkpoint, not loaded
    required = {"pearl": {"draft_model": str(tmp_path)}, "retrieval": {"datastore": datastore}}
    for plugin in PLUGINS:
        spec = spec_config(f"freespec_{plugin}", 5, policy="fixed", **required.get(plugin, {}))
        assert spec.custom_method == f"freespec_{plugin}"
        assert spec.num_speculative_tokens == 5
        assert spec.speculator_options["policy"] == "fixed"
        assert spec.speculator_config.speculator_class.endswith("Speculator")
        assert spec.speculator_config.plugin == plugin


def test_options_reach_the_config_checked_with_defaults_filled(registered):
    spec = spec_config("freespec_copy", 4, min_match=3)
    assert spec.speculator_options["min_match"] == 3 and spec.speculator_options["max_match"] == 32


@pytest.mark.parametrize("method, k, options, field", [
    ("freespec_copy", 4, {"min_match": 0}, "min_match"),
    ("freespec_copy", 4, {"min_match": "3"}, "min_match"),
    ("freespec_copy", 4, {"typo_option": 1}, "typo_option"),
    ("freespec_hybrid", 4, {"sources": ["copy"], "copy": {"min_match": 99}}, "copy.min_match"),
    ("freespec_hybrid", 4, {"scope": "tenant"}, "scope"),
    ("freespec_recycle", 99, {}, "num_speculative_tokens"),
])
def test_a_bad_option_is_refused_at_config_time_naming_the_field(registered, method, k, options, field):
    with pytest.raises(Exception, match=field.replace(".", r"\.")):
        spec_config(method, k, **options)


def test_a_freespec_method_is_not_a_v1_custom_class(registered):
    spec = spec_config("freespec_copy")
    assert spec.method != "custom_class" and spec.speculator_config.base_method is None


def test_the_installed_vllm_passes_every_v2_probe_and_nothing_blocks():
    from freespec.vllm_plugins import probes

    results = {r.seam: r for r in probes.run_probes()}
    for seam in ("v2_registry", "v2_propose", "v2_token_history", "v2_salt_route"):
        assert results[seam].ok and "not used" not in results[seam].detail, (seam, results[seam].detail)
    assert probes.blocking_probes(False) == [] and probes.blocking_probes(True) == []


def test_doctor_names_the_v2_registry_as_the_runner():
    from freespec.vllm_plugins.doctor import model_runner
    from freespec.vllm_plugins.version_gate import is_supported, runner_name

    assert is_supported(vllm.__version__, "vllm")
    assert "speculator registry" in runner_name(vllm.__version__)
    assert "freespec_<plugin>" in model_runner("vllm")["detail"]


def test_the_plugin_spelling_becomes_a_config_vllm_takes(registered):
    from vllm.config import SpeculativeConfig

    from freespec.vllm_plugins.v2.spelling import v2_speculative_config

    spec = SpeculativeConfig(**v2_speculative_config(
        {"plugin": "hybrid", "num_speculative_tokens": 8, "sources": ["recycle", "copy"], "copy": {"min_match": 3},
         "policy": "fixed"}))
    assert spec.custom_method == "freespec_hybrid" and spec.num_speculative_tokens == 8
    assert spec.speculator_options["copy"] == {"min_match": 3} and spec.speculator_options["policy"] == "fixed"
