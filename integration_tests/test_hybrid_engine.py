"""The hybrid plugin with the load-aware goodput policy (the default) on the real vLLM CPU engine and SmolLM2.

Two engine runs. The default plugin (``{"plugin": "hybrid"}``, no options: the ``suffix`` source over
arctic-inference plus ``recycle``) is lossless: greedy text identical to no speculation, sampled text at
temperature 0.8 from the same distribution. Then every source with a datastore, where one engine run gives
both checks of issue 7: hybrid's greedy text is the text without speculation, and at
full batch (39 requests at once) the policy keeps speculation from costing throughput: hybrid's tokens/s is
not below no speculation's by more than the run-to-run noise measured in the same two engines. With fixed
draft bars, hybrid measured 0.64x at 39 requests (results/load-first-sweep/results.md), so this can fail.
"""
from __future__ import annotations

import statistics

import pytest

from integration_tests.conftest import (
    K,
    assert_accepted_share,
    assert_lossless_greedy,
    assert_same_distribution,
    full_batch_jobs,
    greedy_jobs,
    sample_jobs,
    tokens_per_second,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def default_run(engines):
    return engines.run("hybrid_default", {"plugin": "hybrid", "num_speculative_tokens": K}, greedy_jobs() + sample_jobs())


def test_default_hybrid_greedy_text_matches_no_speculation(default_run, baseline):
    run, log = default_run
    assert "without its suffix source" not in log  # the default really ran its suffix source
    assert_lossless_greedy(baseline, run)
    # The load-aware policy drafts by measured step times, so the share moves with the machine: 0.19 and 0.136
    # in two CI runs of the same drafting code. The floor proves the default drafts and is accepted; its speed
    # is freespec bench's to measure.
    assert_accepted_share(run, 0.10)


def test_default_hybrid_sampling_has_the_distribution_of_no_speculation(default_run, baseline):
    run, _ = default_run
    assert_same_distribution(baseline, run)


@pytest.fixture(scope="session")
def hybrid_run(engines, answers_datastore):
    spec = {
        "plugin": "hybrid",
        "num_speculative_tokens": K,
        "sources": ["copy", "recycle", "retrieval"],
        "datastore": answers_datastore,
    }
    return engines.run("hybrid", spec, greedy_jobs() + full_batch_jobs())


def test_hybrid_greedy_text_matches_no_speculation(hybrid_run, baseline):
    assert_lossless_greedy(baseline, hybrid_run[0])


def test_hybrid_drafts_are_accepted_at_low_load(hybrid_run):
    # The datastore holds the answers to these prompts, and one of them is copy-heavy.
    assert_accepted_share(hybrid_run[0], 0.4)


def relative_spread(rates: list[float]) -> float:
    return (max(rates) - min(rates)) / statistics.mean(rates)


def test_full_batch_throughput_is_not_below_no_speculation_beyond_noise(hybrid_run, baseline):
    plain, hybrid = tokens_per_second(baseline), tokens_per_second(hybrid_run[0])
    noise = max(relative_spread(plain), relative_spread(hybrid))
    ratio = statistics.mean(hybrid) / statistics.mean(plain)
    report = (
        f"full batch tokens/s: none {[round(r, 1) for r in plain]}, hybrid {[round(r, 1) for r in hybrid]}; "
        f"ratio {ratio:.3f}, noise (largest relative spread of repeats) {noise:.3f}"
    )
    print(report)
    assert ratio >= 1.0 - noise, report
