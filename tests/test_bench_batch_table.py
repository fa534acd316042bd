"""Stock vLLM at its best: ngram, suffix and draft_model with vLLM 0.32's batch-size table as bench configs."""
from __future__ import annotations

import pytest

from freespec.bench import batch_table, configs


def test_the_field_name_is_vllms():
    # vLLM 0.32's SpeculativeConfig field (vllm/config/speculative.py); checked against the installed vLLM.
    speculative = pytest.importorskip("vllm.config.speculative")
    assert batch_table.TABLE_KEY in speculative.SpeculativeConfig.__dataclass_fields__


def test_table_configs_get_the_default_table():
    ngram = configs.parse_config_spec("ngram-table", 8)
    assert ngram.name == "ngram-table" and ngram.method == "ngram" and not ngram.is_baseline
    assert ngram.speculative_config == {
        "method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 5, "prompt_lookup_min": 5,
        "num_speculative_tokens_per_batch_size": [[1, 4, 8], [5, 12, 4], [13, 512, 0]]}
    suffix = configs.parse_config_spec("suffix-table", 6)
    assert suffix.method == "suffix" and suffix.speculative_config == {
        "method": "suffix", "num_speculative_tokens": 6,
        "num_speculative_tokens_per_batch_size": [[1, 4, 6], [5, 12, 3], [13, 512, 0]]}
    draft = configs.parse_config_spec('draft_model-table:{"model": "/m/draft"}', 4)
    assert draft.method == "draft_model" and draft.speculative_config == {
        "method": "draft_model", "num_speculative_tokens": 4, "model": "/m/draft",
        "num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 12, 2], [13, 512, 0]]}
    with pytest.raises(configs.ConfigSpecError, match="draft_model-table needs option 'model'"):
        configs.parse_config_spec("draft_model-table", 4)
    # K in the options sets the default table's K too.
    assert configs.parse_config_spec('ngram-table:{"num_speculative_tokens": 4}', 8).speculative_config[
        batch_table.TABLE_KEY] == [[1, 4, 4], [5, 12, 2], [13, 512, 0]]


def test_a_table_in_the_options_replaces_the_default_and_works_on_plain_methods():
    table = [[1, 2, 8], [3, 512, 2]]
    spec = 'suffix-table:{"num_speculative_tokens_per_batch_size": [[1, 2, 8], [3, 512, 2]]}'
    assert configs.parse_config_spec(spec, 8).speculative_config[batch_table.TABLE_KEY] == table
    plain = configs.parse_config_spec('ngram:{"num_speculative_tokens_per_batch_size": [[1, 512, 3]]}', 8)
    assert plain.label.startswith("ngram:") and plain.speculative_config[batch_table.TABLE_KEY] == [[1, 512, 3]]
    assert configs.parse_config_spec("ngram", 8).method == "ngram"
    assert configs.parse_config_spec("copy", 8).method is None and configs.parse_config_spec("none", 8).method is None


@pytest.mark.parametrize("table, problem", [
    ([], "non-empty list"),
    ("[[1,4,8]]", "non-empty list"),
    ([[1, 4]], "three integers"),
    ([[1, 4, 8.5]], "three integers"),
    ([[0, 4, 8]], "positive"),
    ([[5, 4, 8]], "above the last"),
    ([[1, 4, -1]], "0 or more"),
    ([[1, 4, 8], [4, 12, 2]], "overlap at batch size 4"),
    ([[2, 4, 8]], "start at batch size 1"),
])
def test_bad_tables_fail_before_a_server_starts(table, problem):
    assert problem in batch_table.check_table(table)
    import json
    with pytest.raises(configs.ConfigSpecError, match="num_speculative_tokens_per_batch_size"):
        configs.parse_config_spec(f'ngram:{{"num_speculative_tokens_per_batch_size": {json.dumps(table)}}}', 8)


def test_k_at_follows_vllms_dense_lookup():
    table = batch_table.default_table(8)
    assert batch_table.check_table(table) is None
    assert [batch_table.k_at(table, b, 8) for b in (1, 4, 5, 12, 13, 39, 600)] == [8, 8, 4, 4, 0, 0, 0]
    assert batch_table.k_at([[1, 16, 3], [32, 128, 2]], 20, 8) == 3  # a gap carries the previous K
    assert batch_table.k_at([[1, 4, 12]], 1, 8) == 8  # clamped to num_speculative_tokens


def test_k_at_agrees_with_vllms_own_lookup():
    utils = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")
    for table in (batch_table.default_table(8), [[1, 16, 3], [32, 128, 2]], [[1, 1, 12], [2, 3, 0], [9, 9, 5]]):
        dense = utils.build_dynamic_sd_schedule_lookup(table, 64, 8)
        assert [batch_table.k_at(table, b, 8) for b in range(1, 65)] == dense[1:]
