"""The pearl plugin on the real vLLM CPU engine: SmolLM2 as its own draft model (to keep CI fast).

A draft model identical to the target proposes what the target will say, so under greedy decoding nearly
every draft token must be accepted, while the text stays exactly the text without speculation. The
Qwen2.5-Coder 1.5B/0.5B pair is for the benchmark (docs/pearl.md).
"""
from __future__ import annotations


import pytest

from integration_tests.conftest import K, PEARL_BUDGET_LINE, PEARL_SYNC, assert_accepted_share, assert_lossless_greedy, greedy_jobs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def pearl_run(engines, model_path):
    spec = {"plugin": "pearl", "num_speculative_tokens": K, "draft_model": model_path, **PEARL_SYNC}
    return engines.run("pearl", spec, greedy_jobs())


def test_pearl_greedy_text_matches_no_speculation(pearl_run, baseline):
    assert_lossless_greedy(baseline, pearl_run[0])


def test_pearl_self_drafts_are_accepted(pearl_run):
    # 998 of 1,155 tokens (0.86), every drafted token accepted, with a 60 s step budget; 0.32-0.44 when the
    # circuit breaker switched pearl off for its seconds-long catch-up steps (conftest.PEARL_SYNC).
    assert PEARL_BUDGET_LINE in pearl_run[1]  # the adapter raised the budget for the catch-up by itself
    assert "circuit breaker open" not in pearl_run[1]
    assert_accepted_share(pearl_run[0], 0.7)


@pytest.mark.long
def test_hybrid_with_the_draft_model_as_a_source_is_lossless_and_drafts_from_it(engines, model_path, baseline):
    """hybrid's ``draft`` source (RASD: the draft chain fused with the suffix trees' candidates)."""
    spec = {"plugin": "hybrid", "num_speculative_tokens": K, "sources": ["suffix", "draft"],
            "draft_model": model_path, "draft": PEARL_SYNC}
    run, log = engines.run("hybrid_draft", spec, greedy_jobs())
    assert "without its suffix source" not in log
    assert PEARL_BUDGET_LINE in log  # the draft source's catch-up raised the adapter's budget, as pearl's does
    assert_lossless_greedy(baseline, run)
    assert_accepted_share(run, 0.3)  # the draft is the target itself: most tokens come from accepted drafts
