"""Files and models that stop the real engine at start, with a message naming the option.

Four engine starts that fail on purpose: a `pearl` draft model that cannot load, a `recycle` matrix file that
is not one, a datastore built with another tokenizer, a `suffix` responses file that is not one. The messages
themselves are also checked without an engine (tests/test_bad_inputs.py); these prove the real engine start
stops with them. About 3 minutes on 2 cores, so they carry the marker `long` and run in CI's matrix job.
"""
from __future__ import annotations

import shutil

import pytest

from freespec.proposers.suffix_tree import available
from integration_tests.conftest import K, build_datastore_of, greedy_jobs
from integration_tests.test_hybrid_persistence import PROMPTS, spec
from integration_tests.test_recycle_engine import pass_job

pytestmark = [pytest.mark.integration, pytest.mark.long]


def test_a_draft_model_that_cannot_load_stops_the_engine_with_a_clear_error(engines, model_path, tmp_path):
    broken = tmp_path / "broken-draft"
    broken.mkdir()
    shutil.copy(f"{model_path}/config.json", broken / "config.json")  # a config, but no weights
    spec = {"plugin": "pearl", "num_speculative_tokens": K, "draft_model": str(broken)}
    _, log = engines.run("pearl_broken", spec, greedy_jobs(), expect_failure=True)
    assert "option 'draft_model'" in log and "cannot be loaded" in log, log[-3000:]


def test_a_foreign_matrix_file_stops_the_engine_with_a_clear_error(engines, tmp_path):
    bad = tmp_path / "foreign.npz"
    bad.write_bytes(b"not a matrix")
    spec = {"plugin": "recycle", "num_speculative_tokens": K, "matrix_path": str(bad)}
    _, log = engines.run("recycle_bad_matrix", spec, [pass_job("pass1")], expect_failure=True)
    assert f"MatrixFileError: recycle matrix_path {str(bad)!r}: not a freespec-recycle-matrix file" in log, log[-3000:]


def test_a_datastore_of_another_tokenizer_stops_the_engine_with_a_clear_error(engines, model_path, tmp_path):
    path = build_datastore_of(tmp_path, model_path, ["some text"], fingerprint="sha256:another-tokenizer")
    spec = {"plugin": "retrieval", "num_speculative_tokens": K, "datastore": path}
    _, log = engines.run("retrieval_foreign", spec, greedy_jobs(), expect_failure=True)
    assert "was built with another tokenizer" in log, log[-3000:]


@pytest.mark.skipif(not available()[0], reason="the suffix source needs arctic-inference")
def test_a_foreign_responses_file_stops_the_engine_naming_the_option(engines, tmp_path):
    bad = tmp_path / "foreign.bin"
    bad.write_bytes(b"not a response store" * 8)
    _, log = engines.run("hybrid_persist_bad", spec(str(bad)),
                         [{"name": "pass", "prompts": PROMPTS[:1], "max_tokens": 8}], expect_failure=True)
    assert "responses_path" in log and str(bad) in log, log[-3000:]
