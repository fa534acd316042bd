"""The retrieval plugin on the real vLLM CPU engine and SmolLM2, with a datastore built by freespec.

The datastore holds what the model answered earlier (the no-speculation run's greedy texts), the way a
datastore built from a service's past traffic would: drafts must then be accepted, and text unchanged.
"""
from __future__ import annotations

import json

import pytest

from integration_tests.conftest import K, assert_lossless_greedy, greedy_jobs

pytestmark = pytest.mark.integration


def build(tmp_path, model_path: str, texts: list[str], fingerprint: str | None = None) -> str:
    from transformers import AutoTokenizer

    from freespec.proposers.datastore_build import build_datastore
    from freespec.proposers.vocab import vocab_fingerprint

    tok = AutoTokenizer.from_pretrained(model_path)
    corpus = tmp_path / "answers.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "datastore"
    build_datastore(
        [corpus],
        out,
        lambda batch: [tok(t, add_special_tokens=False)["input_ids"] for t in batch],
        tokenizer_name=model_path,
        fingerprint=fingerprint or vocab_fingerprint(tok.get_vocab()),
        vocab_size=len(tok),
        progress=False,
    )
    return str(out)


@pytest.fixture(scope="session")
def answers_datastore(baseline, model_path, tmp_path_factory) -> str:
    return build(tmp_path_factory.mktemp("ds"), model_path, baseline["greedy"]["texts"])


@pytest.fixture(scope="session")
def retrieval_run(engines, answers_datastore):
    spec = {"plugin": "retrieval", "num_speculative_tokens": K, "datastore": answers_datastore}
    return engines.run("retrieval", spec, greedy_jobs())


def test_retrieval_greedy_text_matches_no_speculation(retrieval_run, baseline):
    assert_lossless_greedy(baseline, retrieval_run[0])


def test_retrieval_drafts_are_accepted_when_the_datastore_knows_the_answer(retrieval_run):
    result = retrieval_run[0]["greedy"]
    tokens = sum(len(t) for t in result["token_ids"])
    accepted = result["spec"].get("vllm:spec_decode_num_accepted_tokens", 0)
    assert accepted > 0.5 * tokens, f"{accepted} accepted draft tokens for {tokens} output tokens"


def test_a_datastore_of_another_tokenizer_stops_the_engine_with_a_clear_error(engines, model_path, tmp_path):
    path = build(tmp_path, model_path, ["some text"], fingerprint="sha256:another-tokenizer")
    spec = {"plugin": "retrieval", "num_speculative_tokens": K, "datastore": path}
    _, log = engines.run("retrieval_foreign", spec, greedy_jobs(), expect_failure=True)
    assert "was built with another tokenizer" in log, log[-3000:]
