"""Shared fixtures: the real model, and real vLLM engines run once per configuration per session."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from freespec.testing.engines import (  # noqa: F401 (the tests import these from here)
    CODE,
    COPY_HEAVY,
    K,
    SAMPLE_GREEDY_JOB,
    SAMPLE_JOB,
    SAMPLE_PREFIX_JOB,
    SAMPLE_PROMPT,
    SAMPLE_TOKENS,
    SAMPLES,
    EngineRuns,
    assert_lossless_greedy,
    assert_same_distribution,
    default_model,
    sample_jobs,
)

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = REPO.parent / "shared" / "data" / "spec_bench" / "question.jsonl"

# What a datastore holds for the sampled prompt (test_distribution, and the power study in
# docs/reliability.md): the code, renamed as the prompt asks and as given.
CODE_DOCUMENTS = [CODE.replace("def total(", "def column_sum("), CODE] * 4

# Tests of what a plugin learns or how rows map draft at the fixed length K every step: under the goodput policy
# and stepping aside (the defaults) whether and how much is drafted also follows the measured step times, which move
# with the CI machine's speed and load (a mapping check once drafted in 72 steps of a run's ~150 and checked too few).
DRAFT_EVERY_STEP = {"policy": "fixed", "step_aside": False}


def stored(path, identity: tuple[str, int]) -> list[list[int]]:
    """The responses a response store file holds, for a tokenizer ``identity`` (fingerprint, vocabulary size);
    the whole file is checked as a replica reads it."""
    from freespec.proposers.learned.response_store import MAX_RESPONSES, MAX_TOKENS, read_store

    fingerprint, vocab = identity
    found = read_store(str(path), fingerprint=fingerprint, vocab_size=vocab, max_responses=MAX_RESPONSES,
                       max_tokens=MAX_TOKENS)
    return [e.tokens.tolist() for e in found.entries]


def spec_bench_prompts(per_category: int = 1, limit: int = 12, skip: int = 0) -> list[str]:
    """Questions ``skip`` .. ``skip + per_category - 1`` of each Spec-Bench category, in file order (deterministic)."""
    if not QUESTIONS.exists():
        pytest.fail(f"Spec-Bench questions not found at {QUESTIONS}")
    seen: dict[str, int] = {}
    prompts = []
    for line in QUESTIONS.read_text().splitlines():
        q = json.loads(line)
        index = seen.get(q["category"], 0)
        seen[q["category"]] = index + 1
        if skip <= index < skip + per_category:
            prompts.append(q["turns"][0])
    return prompts[:limit]


@pytest.fixture(scope="session")
def model_path() -> str:
    return default_model()


@pytest.fixture(scope="session")
def engines(model_path, tmp_path_factory) -> EngineRuns:
    # The engines import from the checkout (integration_tests.faulty's plugins), as the tests do.
    return EngineRuns(model_path, tmp_path_factory.mktemp("engines"), pythonpath=[str(REPO)], cwd=REPO)


# ---------------------------------------------------------------- the lossless check, shared by every plugin
# (the criteria, the sampled prompt and the engine runs are freespec.testing's, the kit plugin authors use)
# pearl in these tests reads every prompt before drafting on it (synchronous catch-up, so what it drafts does
# not depend on timing). Such a step takes seconds on 2 cores, past the adapter's default step budget of 1 s;
# the adapter raises the budget to pearl's step_timeout_s for it (Proposer.step_time_needed). When the breaker
# switched pearl off for those steps, each skipped step left its draft further behind (a CI run: 455 of 1,155
# greedy tokens from accepted drafts; 998 with a 60 s budget).
PEARL_SYNC = {"sync_feed_tokens": 4096}
# The adapter's log line when it raised the budget for PEARL_SYNC (pearl's default step_timeout_s, 30 s).
PEARL_BUDGET_LINE = "step budget 30000 ms (not 'step_budget_ms' 1000)"


def greedy_jobs(logprobs: bool = False) -> list[dict]:
    extra = {"logprobs": 2} if logprobs else {}
    return [
        {"name": "greedy", "prompts": spec_bench_prompts() + [COPY_HEAVY], "max_tokens": 96, **extra},
        {"name": "copy_heavy", "prompts": [COPY_HEAVY], "max_tokens": 120},
    ]


# Full batch: 39 requests at once (3 per Spec-Bench category, none of them a greedy_jobs prompt), the load
# under which speculation spends compute the batch needed. Run once untimed (so every timed repeat finds the
# prompts in the prefix cache alike, and the policy has seen this load: its first steps at a new load are
# still adapting — 76 vs 92-95 tok/s in a trial with a 1-token warm-up), then timed REPEATS times in the same
# engine: the spread of those repeats is the run-to-run noise a throughput comparison is judged against.
FULL_BATCH_REPEATS = 3


def full_batch_jobs() -> list[dict]:
    prompts = spec_bench_prompts(per_category=3, limit=39, skip=1)
    prefill = {"name": "full_batch_0", "prompts": prompts, "max_tokens": 24}
    timed = [{"name": f"full_batch_{i}", "prompts": prompts, "max_tokens": 48} for i in range(1, FULL_BATCH_REPEATS + 1)]
    return [prefill] + timed


def tokens_per_second(run) -> list[float]:
    """Output tokens per second of each timed full-batch repeat (the warm-up run is left out)."""
    rates = []
    for job in full_batch_jobs()[1:]:
        result = run[job["name"]]
        rates.append(sum(len(t) for t in result["token_ids"]) / result["seconds"])
    return rates


@pytest.fixture(scope="session")
def baseline(engines):
    jobs = greedy_jobs(logprobs=True) + sample_jobs() + [SAMPLE_GREEDY_JOB] + full_batch_jobs()
    return engines.run("none", None, jobs)[0]


def assert_accepted_share(run, share: float) -> None:
    """More than ``share`` of the greedy job's output tokens came from accepted drafts."""
    result = run["greedy"]
    tokens = sum(len(t) for t in result["token_ids"])
    accepted = result["spec"].get("vllm:spec_decode_num_accepted_tokens", 0)
    assert accepted > share * tokens, f"{accepted} accepted draft tokens for {tokens} output tokens"


# ---------------------------------------------------------------- a datastore of the model's own answers
def build_datastore_of(tmp_path, model_path: str, texts: list[str], fingerprint: str | None = None) -> str:
    """A retrieval datastore holding ``texts`` (one document each), built with the model's tokenizer."""
    from transformers import AutoTokenizer

    from freespec.proposers.retrieval.build import build_datastore
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
    """What the model answered without speculation, as a datastore (like one built from past traffic)."""
    return build_datastore_of(tmp_path_factory.mktemp("ds"), model_path, baseline["greedy"]["texts"])
