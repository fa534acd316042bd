"""``--configs`` entries: names, JSON options, and plugin configs checked by the front-end's rules."""
from __future__ import annotations

import pytest

from freespec.bench import configs


def test_parse_config_spec_builtin_methods():
    none = configs.parse_config_spec("none", 8)
    assert none.is_baseline and none.speculative_config is None and none.label == "none"
    ngram = configs.parse_config_spec("ngram", 8)
    assert ngram.speculative_config == {
        "method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 5, "prompt_lookup_min": 5,
    }
    suffix = configs.parse_config_spec("suffix", 6)
    assert suffix.speculative_config == {"method": "suffix", "num_speculative_tokens": 6}


def test_parse_config_spec_vllm_draft_model_needs_its_model():
    sc = configs.parse_config_spec('draft_model:{"model": "/m/draft"}', 4).speculative_config
    assert sc == {"method": "draft_model", "num_speculative_tokens": 4, "model": "/m/draft"}
    with pytest.raises(configs.ConfigSpecError, match=r"draft_model needs option 'model'"):
        configs.parse_config_spec("draft_model", 4)


def test_parse_config_spec_ngram_options_replace_lookup_defaults():
    sc = configs.parse_config_spec('ngram:{"prompt_lookup_min": 2}', 8).speculative_config
    assert sc == {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2}


def test_parse_config_spec_plugin_with_options():
    config = configs.parse_config_spec('copy:{"min_match": 3, "num_speculative_tokens": 4}', 8)
    assert config.name == "copy"
    assert config.label == 'copy:{"min_match": 3, "num_speculative_tokens": 4}'
    assert config.speculative_config == {"plugin": "copy", "num_speculative_tokens": 4, "min_match": 3}
    plain = configs.parse_config_spec("copy", 8)
    assert plain.speculative_config == {"plugin": "copy", "num_speculative_tokens": 8}


def test_a_plugin_named_by_its_import_path_is_a_whole_json_config():
    spec = '{"plugin": "freespec.proposers.copy:CopyProposer", "min_match": 3}'
    config = configs.parse_config_spec(spec, 8)
    assert config.label == spec and config.name == "freespec.proposers.copy:CopyProposer"
    assert config.speculative_config == {"plugin": "freespec.proposers.copy:CopyProposer",
                                         "num_speculative_tokens": 8, "min_match": 3}
    assert [c.label for c in configs.parse_config_list([spec, "copy"], 8)][-2:] == [spec, "copy"]


@pytest.mark.parametrize(
    "spec, message",
    [
        ('copy:{"min_match": 3', r"config 'copy'.*not valid JSON"),
        ("copy:[1, 2]", r"config 'copy'.*JSON object"),
        ("copy:", r"nothing after ':'"),
        ('none:{"x": 1}', r"takes no options"),
        ('copy:{"plugin": "other"}', r"option 'plugin'"),
        ('ngram:{"method": "suffix"}', r"option 'method'"),
        ("bad name", r"not a config name"),
        ("copy+fixes", r"'\+fixes' is for vLLM's own methods"),
        ("+fixes", r"not a config name"),
        # A plugin's config is checked by the front-end's rules (as `vllm serve` would), before any server.
        ('copy:{"colour": "red"}', r"config 'copy:.*unknown option 'colour'.*Allowed options: "),
        ('copy:{"min_match": "three"}', r"option 'min_match'"),
        ('copy:{"model": "/m"}', r"both 'plugin' and 'model'"),
        ('copy:{"num_speculative_tokens": 0}', r"'num_speculative_tokens' must be an integer in \[1, 64\]"),
        ('copy:{"policy": "greedy"}', r"'policy' must be one of"),
        ("telepathy", r"unknown freespec plugin 'telepathy'.*copy"),
        ('{"plugin": "copy"', r"not valid JSON"),
        ('{"min_match": 3}', r"names its 'plugin'"),
        ('{"plugin": "nowhere.at_all:Drafter"}', r"cannot be loaded"),
        ('{"plugin": "freespec.proposers.copy:CopyProposer", "colour": "red"}', r"unknown option 'colour'"),
    ],
)
def test_parse_config_spec_errors_name_the_config(spec, message):
    with pytest.raises(configs.ConfigSpecError, match=message):
        configs.parse_config_spec(spec, 8)


def test_split_config_list_keeps_json_together():
    assert configs.split_config_list('none, ngram,copy:{"a": 1, "b": [1, 2], "c": "x,}"},suffix') == [
        "none", "ngram", 'copy:{"a": 1, "b": [1, 2], "c": "x,}"}', "suffix",
    ]


def test_parse_config_list_puts_baseline_first_and_adds_it():
    parsed = configs.parse_config_list(["ngram,none", "copy"], 8)
    assert [c.label for c in parsed] == ["none", "ngram", "copy"]
    parsed = configs.parse_config_list(["ngram"], 8)
    assert [c.label for c in parsed] == ["none", "ngram"]
    with pytest.raises(configs.ConfigSpecError, match="twice"):
        configs.parse_config_list(["ngram", "ngram"], 8)



def test_a_checked_plugin_config_is_recorded_as_written():
    # The front-end rewrites the config for vLLM when the server starts; the run records the user's form.
    config = configs.parse_config_spec('copy:{"policy": "fixed", "step_budget_ms": 500}', 8)
    assert config.speculative_config == {"plugin": "copy", "num_speculative_tokens": 8, "policy": "fixed",
                                         "step_budget_ms": 500}


@pytest.mark.parametrize("spec", ["none", "ngram", "suffix", "ngram-table", 'draft_model:{"model": "/m"}', "copy"])
def test_every_config_runs_without_the_fixes_of_vllm_defects_for_vllms_own_methods(spec):
    # whatever the shell running the benchmark sets: stock vLLM as users get it (a plugin has its fixes anyway)
    assert configs.parse_config_spec(spec, 8).env == {"FREESPEC_FIX_VLLM": ""}


@pytest.mark.parametrize("spec, method", [("suffix+fixes", "suffix"), ("ngram+fixes", "ngram"),
                                          ('suffix-table+fixes:{"num_speculative_tokens": 4}', "suffix")])
def test_a_patched_stock_row_is_asked_for_by_name_and_sets_the_opt_in_for_its_server(spec, method):
    config = configs.parse_config_spec(spec, 8)
    assert config.env == {"FREESPEC_FIX_VLLM": "all"} and config.method == method and config.label == spec
    plain = configs.parse_config_spec(spec.replace("+fixes", ""), 8)
    assert config.speculative_config == plain.speculative_config
    assert [c.label for c in configs.parse_config_list(["suffix,suffix+fixes"], 8)] == ["none", "suffix",
                                                                                         "suffix+fixes"]


def test_a_configs_env_reaches_its_server_only(tmp_path, monkeypatch):
    import sys

    from freespec.bench.server import Server

    monkeypatch.setenv("FREESPEC_FIX_VLLM", "last_step_cache")  # the shell's; the stock row clears it
    code = "import os; print('fix=' + repr(os.environ.get('FREESPEC_FIX_VLLM')))"
    for spec, expected in (("suffix", "fix=''"), ("suffix+fixes", "fix='all'")):
        log = tmp_path / f"{spec}.log"
        server = Server([sys.executable, "-c", code], 0, log, env=configs.parse_config_spec(spec, 8).env)
        server.start()
        server.proc.wait(timeout=60)
        assert expected in log.read_text()
