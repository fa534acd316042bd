"""The default plugin learns across restarts: one engine saves its responses at exit, the next loads them.

Real vLLM CPU engine and SmolLM2. The second engine meets the same prompts again (repeated traffic, the case
persistence is for), so its drafts come from the first engine's answers from the first request on. A file
written by ``freespec responses build`` (the model's own answers, offline) starts an engine warm the same way.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from integration_tests.conftest import DRAFT_EVERY_STEP, K, spec_bench_prompts, stored
from freespec.proposers.suffix_tree import SuffixOptions, available

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not available()[0], reason="the suffix source needs arctic-inference")]

PROMPTS = spec_bench_prompts(per_category=1, limit=13)[:6]
TOKENS = 64


def accepted_per_token(result: dict) -> float:
    tokens = sum(len(t) for t in result["token_ids"])
    return result["spec"].get("vllm:spec_decode_num_accepted_tokens", 0) / tokens


def spec(path: str) -> dict:
    return {"plugin": "hybrid", "num_speculative_tokens": K, "suffix": {"responses_path": path, "save_every_s": 0},
            **DRAFT_EVERY_STEP}


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


@pytest.mark.long  # a server of its own, about 100 s: CI's matrix job
def test_a_file_from_responses_build_starts_a_server_warm(cold_run, engines, tmp_path, responses_file):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n" for p in PROMPTS))
    built = engines.workdir / "built-responses.bin"
    # The build's offline engine runs without torch.compile, like the test engines (engine_run's enforce_eager):
    # compiling took it 85 to 115 s on 2 cores, and what is checked is the file it writes.
    # VLLM_CPU_CI_ENV is vLLM's own switch for this (dynamo with the eager backend, no warm-up).
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("freespec")), "responses", "build", "--model", engines.model,
         "--prompts", str(prompts), "--out", str(built), "--max-tokens", str(TOKENS), "--dtype", "float32",
         "--max-model-len", "2048"],
        capture_output=True, text=True, timeout=900, env={**os.environ, "VLLM_CPU_CI_ENV": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == str(built)  # vLLM logs to stdout as well
    assert f"{len(PROMPTS)} responses" in proc.stderr
    warm, log = engines.run("hybrid_built_warm", spec(str(built)),
                            [{"name": "pass", "prompts": PROMPTS, "max_tokens": TOKENS}])
    assert f"response store loaded {len(PROMPTS)} responses" in log, log[-3000:]
    # The built answers are the model's greedy answers to these prompts: drafted from the first request on.
    assert warm["pass"]["token_ids"] == cold_run[0]["pass"]["token_ids"]
    cold, again = accepted_per_token(cold_run[0]["pass"]), accepted_per_token(warm["pass"])
    assert again > cold + 0.2, f"accepted per output token: cold start {cold:.3f}, built warm start {again:.3f}"
    # Each held as the engine learned it: the prompt's last prompt_tail tokens, then the answer (the engine's
    # file lacks each answer's last step: a request's last tokens reach the drafter only if it steps again).
    from freespec.vllm_plugins.adapter import tokenizer_fingerprint
    from transformers import AutoConfig

    identity = (tokenizer_fingerprint(engines.model), AutoConfig.from_pretrained(engines.model).vocab_size)
    saved, built_ = stored(responses_file, identity), stored(built, identity)
    tail = SuffixOptions().prompt_tail
    assert len(built_) == len(PROMPTS)  # (the engines' file: the cold run's and the warm run's, a step apart)
    assert all(any(len(r) > tail and b[:len(r)] == r for r in saved) for b in built_), (saved, built_)

