"""Token recycling on the real vLLM CPU engine and SmolLM2: lossless, learns, warm-starts, maps rows right."""
from __future__ import annotations

import json
import os

import pytest

from integration_tests.conftest import (
    DRAFT_EVERY_STEP,
    K,
    assert_lossless_greedy,
    assert_same_distribution,
    greedy_jobs,
    sample_jobs,
    spec_bench_prompts,
)

pytestmark = pytest.mark.integration

# Prompts the warm-up/warm-start checks measure (two passes over them: cold, then warm).
PASS_PROMPTS = spec_bench_prompts(per_category=1, limit=13)[6:12]
PASS_TOKENS = 64


def pass_job(name: str) -> dict:
    return {"name": name, "prompts": PASS_PROMPTS, "max_tokens": PASS_TOKENS}


def accepted_per_token(result: dict) -> float:
    spec = result["spec"]
    tokens = sum(len(t) for t in result["token_ids"])
    return spec.get("vllm:spec_decode_num_accepted_tokens", 0) / tokens


@pytest.fixture(scope="session")
def matrix_file(engines) -> str:
    return str(engines.workdir / "recycle-matrix.npz")


@pytest.fixture(scope="session")
def recycle_run(engines, matrix_file):
    """Cold start with a matrix_path (saved only at exit: save_every_s 0), two passes, then the lossless jobs.

    These tests check what recycling learns, so they draft at the fixed length: under the goodput policy
    (the default) how much is drafted also follows the measured step times, which moves with the CI
    machine's load; a pass once measured cold 0.053, warm 0.084 accepted/token that way.
    """
    assert not os.path.exists(matrix_file)
    spec = {"plugin": "recycle", "num_speculative_tokens": K, "matrix_path": matrix_file, "save_every_s": 0, **DRAFT_EVERY_STEP}
    return engines.run("recycle", spec, [pass_job("pass1"), pass_job("pass2")] + greedy_jobs() + sample_jobs())


def test_recycle_greedy_text_matches_no_speculation(recycle_run, baseline):
    assert_lossless_greedy(baseline, recycle_run[0])


def test_sampling_with_recycle_has_the_distribution_of_no_speculation(recycle_run, baseline):
    assert_same_distribution(baseline, recycle_run[0], accepted_share=0.0)


def test_acceptance_rises_after_a_warm_up_pass(recycle_run):
    results, _ = recycle_run
    cold, warm = accepted_per_token(results["pass1"]), accepted_per_token(results["pass2"])
    assert warm > cold + 0.05, f"accepted tokens per output token: cold {cold:.3f}, after warm-up {warm:.3f}"


def test_matrix_is_saved_at_exit(recycle_run, matrix_file):
    assert os.path.exists(matrix_file), f"the engine did not save its matrix at exit:\n{recycle_run[1][-3000:]}"


# A second engine: in the long set (CI's matrix job) to keep the test command under 45 minutes. The default
# plugin's restart (test_hybrid_persistence) stays in it, and the matrix file's loading has its unit tests.
@pytest.mark.long
def test_a_warm_start_from_the_saved_matrix_beats_a_cold_one(recycle_run, engines, matrix_file):
    assert os.path.exists(matrix_file), "the engine did not save its matrix at exit"
    spec = {"plugin": "recycle", "num_speculative_tokens": K, "matrix_path": matrix_file, **DRAFT_EVERY_STEP}
    warm, log = engines.run("recycle_warm", spec, [pass_job("pass1")])
    assert "recycle matrix loaded from" in log
    cold = accepted_per_token(recycle_run[0]["pass1"])
    first = accepted_per_token(warm["pass1"])
    assert first > cold + 0.05, f"first requests: cold start {cold:.3f}, warm start {first:.3f} accepted/token"


@pytest.mark.long  # an engine of its own, about 75 s: CI's matrix job, per vLLM release (a runner seam)
def test_logits_rows_map_to_the_right_tokens_in_mixed_and_reordered_batches(engines, tmp_path):
    """Ground truth from greedy decoding (see integration_tests/topk_check.py)."""
    out = tmp_path / "check.json"
    long_prompts = spec_bench_prompts(per_category=2, limit=26)  # includes long summarization/RAG prompts
    jobs = [
        {
            "name": "mixed",
            "prompts": long_prompts,
            "max_tokens": 48,
        }
    ]
    engines.run(
        "recycle_mapping",
        {"plugin": "integration_tests.topk_check:MappingCheckProposer", "num_speculative_tokens": K, **DRAFT_EVERY_STEP},
        jobs,
        env={"FREESPEC_TOPK_CHECK_OUT": str(out)},
        # Small chunks: long prompts are prefilled over several steps while other requests decode.
        engine_args={"max_num_batched_tokens": 256, "max_num_seqs": 8, "enable_chunked_prefill": True},
    )
    c = json.loads(out.read_text())
    assert c["checked"] > 500 and c["reordered"] > 0, c
    assert c["observed_steps"] >= 0.9 * c["steps"], c  # steps the adapter could not map are rare
    assert c["wrong"] == 0, c
