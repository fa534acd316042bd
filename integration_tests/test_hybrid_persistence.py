"""The default plugin learns across restarts: one engine saves its responses at exit, the next loads them.

Real vLLM CPU engine and SmolLM2. The second engine meets the same prompts again (repeated traffic, the case
persistence is for), so its drafts come from the first engine's answers from the first request on.
"""
from __future__ import annotations

import os

import pytest

from integration_tests.conftest import K, spec_bench_prompts
from freespec.proposers.suffix_tree import available

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not available()[0], reason="the suffix source needs arctic-inference")]

PROMPTS = spec_bench_prompts(per_category=1, limit=13)[:6]
TOKENS = 64
# Fixed length: what is drafted then follows what was learned, not the CI machine's step times.
FIXED = {"policy": "fixed"}


def accepted_per_token(result: dict) -> float:
    tokens = sum(len(t) for t in result["token_ids"])
    return result["spec"].get("vllm:spec_decode_num_accepted_tokens", 0) / tokens


def spec(path: str) -> dict:
    return {"plugin": "hybrid", "num_speculative_tokens": K, "suffix": {"responses_path": path, "save_every_s": 0},
            **FIXED}


@pytest.fixture(scope="module")
def responses_file(engines) -> str:
    return str(engines.workdir / "hybrid-responses.bin")


@pytest.fixture(scope="module")
def cold_run(engines, responses_file):
    assert not os.path.exists(responses_file)
    return engines.run("hybrid_persist_cold", spec(responses_file),
                       [{"name": "pass", "prompts": PROMPTS, "max_tokens": TOKENS}])


def test_responses_are_saved_at_exit_and_a_restart_drafts_from_them(cold_run, engines, responses_file):
    assert os.path.exists(responses_file), f"the engine did not save its responses at exit:\n{cold_run[1][-3000:]}"
    warm, log = engines.run("hybrid_persist_warm", spec(responses_file),
                            [{"name": "pass", "prompts": PROMPTS, "max_tokens": TOKENS}])
    assert "response store loaded" in log, log[-3000:]
    cold = accepted_per_token(cold_run[0]["pass"])
    again = accepted_per_token(warm["pass"])
    # Greedy: the warm engine's answers are the cold one's, which its global tree already holds.
    assert warm["pass"]["token_ids"] == cold_run[0]["pass"]["token_ids"]
    assert again > cold + 0.2, f"accepted per output token: cold start {cold:.3f}, warm start {again:.3f}"
