"""The retrieval plugin on the real vLLM CPU engine and SmolLM2, with a datastore built by freespec.

The datastore holds what the model answered earlier (the no-speculation run's greedy texts), the way a
datastore built from a service's past traffic would: drafts must then be accepted, and text unchanged.
"""
from __future__ import annotations

import pytest

from integration_tests.conftest import K, assert_accepted_share, assert_lossless_greedy, greedy_jobs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def retrieval_run(engines, answers_datastore):
    spec = {"plugin": "retrieval", "num_speculative_tokens": K, "datastore": answers_datastore}
    return engines.run("retrieval", spec, greedy_jobs())


def test_retrieval_greedy_text_matches_no_speculation(retrieval_run, baseline):
    assert_lossless_greedy(baseline, retrieval_run[0])


def test_retrieval_drafts_are_accepted_when_the_datastore_knows_the_answer(retrieval_run):
    assert_accepted_share(retrieval_run[0], 0.5)
