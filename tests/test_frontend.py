"""The ``plugin`` front-end's translation and refusals (no vLLM)."""
import pytest

from freespec.vllm_plugins.frontend import ADAPTER_CLASS, FreespecConfigError, translate
from freespec.vllm_plugins.version_gate import is_supported


def test_plugin_becomes_custom_class_with_options_in_additional_config():
    spec, extra = translate({"plugin": "copy", "num_speculative_tokens": 6, "min_match": 3}, {"other": 1})
    assert spec == {"method": "custom_class", "model": ADAPTER_CLASS, "num_speculative_tokens": 6}
    assert extra["other"] == 1
    assert extra["freespec"]["plugin"] == "copy"
    assert extra["freespec"]["options"]["min_match"] == 3
    assert extra["freespec"]["options"]["max_match"] == 32  # defaults are filled in


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"plugin": "nope", "num_speculative_tokens": 4}, r"unknown freespec plugin 'nope'.*copy"),
        ({"plugin": "copy", "num_speculative_tokens": 4, "colour": 1}, r"unknown option 'colour'.*min_match"),
        ({"plugin": "copy", "num_speculative_tokens": 4, "min_match": "x"}, r"option 'min_match'"),
        ({"plugin": "copy", "num_speculative_tokens": 4, "min_match": 99}, r"option 'min_match'.*less than"),
        ({"plugin": "copy"}, r"num_speculative_tokens"),
        ({"plugin": "copy", "num_speculative_tokens": 0}, r"num_speculative_tokens"),
        ({"plugin": "copy", "method": "ngram", "num_speculative_tokens": 4}, r"'method'"),
    ],
)
def test_bad_configs_are_refused_naming_the_field(spec, message):
    with pytest.raises(ValueError, match=message):
        translate(spec, None)


def test_config_error_is_a_value_error():
    assert issubclass(FreespecConfigError, ValueError)


@pytest.mark.parametrize("version, ok", [("0.32.0", True), ("0.32.5+cpu", True), ("0.31.0", True), ("0.30.9", False), ("0.33.0", False)])
def test_supported_range(version, ok):
    assert is_supported(version) is ok


def test_plugin_given_as_module_and_class_path():
    spec, extra = translate({"plugin": "freespec.proposers.copy:CopyProposer", "num_speculative_tokens": 2}, None)
    assert extra["freespec"]["plugin"] == "freespec.proposers.copy:CopyProposer"


@pytest.mark.parametrize("plugin", ["freespec.nothing:Here", "freespec.proposers.copy:CopyOptions"])
def test_unloadable_plugin_paths_are_refused(plugin):
    with pytest.raises(ValueError, match="cannot be loaded|not a freespec Proposer"):
        translate({"plugin": plugin, "num_speculative_tokens": 2}, None)


def test_policy_key_goes_to_the_adapter_and_defaults_to_goodput():
    _, extra = translate({"plugin": "copy", "num_speculative_tokens": 4}, None)
    assert extra["freespec"]["policy"] == "goodput"
    _, extra = translate({"plugin": "copy", "num_speculative_tokens": 4, "policy": "fixed"}, None)
    assert extra["freespec"]["policy"] == "fixed" and "policy" not in extra["freespec"]["options"]
    with pytest.raises(FreespecConfigError, match="'policy' must be one of \\['goodput', 'fixed'\\]"):
        translate({"plugin": "copy", "num_speculative_tokens": 4, "policy": "fast"}, None)


def test_a_missing_pearl_draft_model_is_refused_naming_the_option(tmp_path):
    with pytest.raises(FreespecConfigError, match="draft_model.*nowhere"):
        translate({"plugin": "pearl", "num_speculative_tokens": 4, "draft_model": str(tmp_path / "nowhere")}, None)


def test_disable_by_batch_size_is_refused_naming_the_field_and_the_policy():
    # No supported vLLM (0.31, 0.32) has this SpeculativeConfig field: passing it on would make vLLM
    # refuse the config with a bare "Unexpected keyword argument".
    with pytest.raises(FreespecConfigError, match=r"'disable_by_batch_size'.*\"policy\": \"goodput\""):
        translate({"plugin": "copy", "num_speculative_tokens": 4, "disable_by_batch_size": 8}, None)


def test_only_num_speculative_tokens_is_passed_through_to_vllm():
    from freespec.vllm_plugins.frontend import VLLM_KEYS

    spec, _ = translate({"plugin": "copy", "num_speculative_tokens": 4}, None)
    assert set(spec) == {"method", "model", "num_speculative_tokens"}
    assert VLLM_KEYS == ("num_speculative_tokens",)
