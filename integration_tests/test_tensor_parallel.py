"""Tensor parallelism on the real vLLM CPU engine: TP=2, two worker processes, Qwen2.5-Coder-0.5B-Instruct.

Each worker gets its own core (``VLLM_CPU_OMP_THREADS_BIND="0|1"``; without it vLLM
refuses to start two CPU workers on this machine). Checked against the same TP=2
engine without speculation: the lossless criterion, drafts accepted, and that
only the rank whose drafts vLLM takes built the plugin (every rank logs which it
is: ``ranks.draft_rank``). Two engine starts in all, one per configuration.
"""
from __future__ import annotations

import re

import pytest

from integration_tests.conftest import COPY_HEAVY, K, EngineRuns, assert_lossless_greedy, spec_bench_prompts

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

MODEL = "qwen2.5-coder-0.5b-instruct"  # 14 query / 2 KV heads: splits over 2 ranks (SmolLM2-135M's 9 do not)
TP = 2
# One core per worker; 1 GiB of KV cache per worker instead of a share of host RAM (two workers reserve twice).
TP_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_CPU_KVCACHE_SPACE": "1"}
TP_ARGS = {"tensor_parallel_size": TP}
COPY = {"plugin": "copy", "num_speculative_tokens": K}


def jobs(logprobs: bool = False) -> list[dict]:
    extra = {"logprobs": 2} if logprobs else {}
    return [{"name": "greedy", "prompts": [COPY_HEAVY] + spec_bench_prompts(limit=3), "max_tokens": 64, **extra}]


@pytest.fixture(scope="module")
def tp_engines(tmp_path_factory) -> EngineRuns:
    from freespec.model_store import prepare_model

    return EngineRuns(str(prepare_model(MODEL)), tmp_path_factory.mktemp("tp"))


@pytest.fixture(scope="module")
def tp_baseline(tp_engines):
    return tp_engines.run("tp2-none", None, jobs(logprobs=True), env=TP_ENV, engine_args=TP_ARGS)[0]


@pytest.fixture(scope="module")
def tp_copy(tp_engines):
    return tp_engines.run("tp2-copy", COPY, jobs(), env=TP_ENV, engine_args=TP_ARGS)


def test_tp2_copy_greedy_text_matches_no_speculation(tp_baseline, tp_copy):
    assert_lossless_greedy(tp_baseline, tp_copy[0])


def test_tp2_copy_drafts_are_accepted(tp_copy):
    spec = tp_copy[0]["greedy"]["spec"]
    assert spec.get("vllm:spec_decode_num_drafts", 0) > 0, spec
    assert spec.get("vllm:spec_decode_num_accepted_tokens", 0) > 0, spec


def test_tp2_only_the_rank_whose_drafts_vllm_takes_builds_the_plugin(tp_copy):
    _, log = tp_copy
    # vLLM builds the custom_class adapter on both ranks ...
    assert len(re.findall(r"Loaded custom proposer class 'freespec\.", log)) == TP, log[-5000:]
    # ... the adapter builds the plugin on TP rank 0 only, and each rank says which it is, once.
    runs = re.findall(r"freespec: TP rank (\d) of 2: plugin 'copy' runs here", log)
    idle = re.findall(r"freespec: TP rank (\d) of 2: plugin 'copy' not built here", log)
    assert (runs, idle) == (["0"], ["1"]), log[-5000:]
    assert len(re.findall(r"freespec: plugin 'copy' with k=", log)) == 1, log[-5000:]
